"""``dbspec tensorboard``: fetch a training run's event files and start TensorBoard on them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dbspec.errors import DbspecError


def fetch_event_files(client, run_id: str, destination: Path) -> Path:
    """Download the run's ``tensorboard`` artifacts; the local log directory (DbspecError for
    no such run, or a run without event files)."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise DbspecError(f"the tracking store at {client.tracking_uri} did not answer: "
                              f"{_first_line(exc)}") from None
        raise DbspecError(f"no MLflow run {run_id} in this tracking store") from None
    names = [item.path for item in client.list_artifacts(run_id)]
    if "tensorboard" not in names:
        raise DbspecError(f"run {run_id} has no TensorBoard event files: set "
                          "tracking.tensorboard: true in the spec and train again")
    # through MLflow's artifact API: the files may sit behind a tracking server or in a cloud
    # store, never assume the run's artifact URI is a local path
    try:
        destination.mkdir(parents=True, exist_ok=True)
        return Path(client.download_artifacts(run_id, "tensorboard", str(destination)))
    except (MlflowException, OSError) as exc:
        raise DbspecError(f"cannot download the event files of run {run_id}: "
                          f"{_first_line(exc)}") from None


def _first_line(exc: Exception) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def start_tensorboard(logdir: Path, port: int) -> int:
    """Run TensorBoard on 127.0.0.1 in the foreground until Ctrl-C; its exit code."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise DbspecError(f"TensorBoard is not installed (pip install tensorboard); the event "
                          f"files are in {logdir}") from None
    print(f"TensorBoard on http://127.0.0.1:{port} for {logdir} (Ctrl-C stops it)",
          file=sys.stderr, flush=True)
    try:
        return subprocess.call([sys.executable, "-m", "tensorboard.main", "--logdir",
                                str(logdir), "--host", "127.0.0.1", "--port", str(port)])
    except KeyboardInterrupt:
        return 0

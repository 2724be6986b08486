"""Where stage state and stage files live between invocations.

``LocalState`` (the default): ``.dbspec/runs/<spec>[@target]/state.json`` and a
:class:`~dbspec.executors.cache.StageCache`, so returning to an earlier spec reuses its stages.

``MlflowState``: the MLflow run tagged ``dbspec.run_key=<key>``, each stage's entry as
``dbspec/state/<stage>.json`` and its files under ``dbspec/stages/<stage>/``. Processes on
different machines with one tracking server and run key (``--run-key {{job.run_id}}`` in a
generated job) hand stages over through it. Checkpoints stay local. Only a key with no
pipeline run, or a run without ``dbspec/state``, means "nothing ran yet": any failure to read
the state is a :class:`StateError`, so a job task fails instead of silently redoing every stage.
"""

from __future__ import annotations

import os
import contextlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Optional

from dbspec.errors import DbspecError
from dbspec.executors.cache import Removal, StageCache, read_state
from dbspec.executors.records import RunState, StageEntry
from dbspec.executors.recovery import quoted
from dbspec.paths import inside
from dbspec.stages.base import write_json

_LOCAL_ONLY = ("checkpoints", "error.txt")


class StateError(DbspecError):
    """The stage state of a run key cannot be read from (or written to) MLflow."""


def state_dir_of(run_dir: Path, run_key: Optional[str]) -> Path:
    """Where a run's ``state.json``/``stages`` live: the run dir, or its ``key-<key>`` slot."""
    return inside(Path(run_dir), f"key-{_safe(run_key)}") if run_key else Path(run_dir)


class LocalState:
    """Stage state in ``run_dir/state.json``, stage files in ``run_dir/stages/<name>``: a link
    to the folder of the current fingerprint in the stage cache (see :mod:`.cache`)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.cache = StageCache(self.run_dir)

    def load(self) -> RunState:
        return RunState.from_json(read_state(self.run_dir))

    def save(self, state: RunState, changed: Iterable[str] = ()) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json(self.run_dir / "state.json", state.to_json())

    def tidy(self) -> None:
        """Clean up after writers that died re-pointing a stage (under the run lock)."""
        self.cache.tidy()

    def stage_dir(self, name: str) -> Path:
        return inside(self.run_dir, "stages", name)

    def holds(self, name: str, fingerprint: str) -> bool:
        return self.cache.holds(name, fingerprint)

    def reuse(self, name: str, fingerprint: str,
              inputs: dict[str, str]) -> Optional[StageEntry]:
        """The cached finished entry of ``name`` at ``fingerprint`` made from ``inputs``
        (:func:`~dbspec.executors.cache.inputs_of`), made current; or None."""
        entry = self.cache.lookup(name, fingerprint, inputs)
        if entry is None:
            return None
        self.use(name, fingerprint)
        return StageEntry.from_json(entry)  # without the cache's "used"

    def use(self, name: str, fingerprint: str) -> None:
        """Point :meth:`stage_dir` at the files of ``fingerprint`` and mark them used."""
        self.cache.point(name, fingerprint)
        self.cache.touch(name, fingerprint)

    def prepare(self, name: str, fingerprint: str, *, resume: bool) -> Path:
        """The (empty, or with ``resume`` the kept) directory a run of ``name`` writes to."""
        return self.cache.prepare(name, fingerprint, keep_files=resume)

    def keep(self, name: str, entry: StageEntry) -> None:
        """Keep a finished stage's entry in the cache, reusable at its fingerprint."""
        self.cache.record(name, entry.to_json())

    def evict(self, state: RunState, keep: int) -> list[Removal]:
        return self.cache.evict(state.to_json(), keep)

    def fetch(self, names: Iterable[str]) -> None:
        """Make the files of ``names`` available under :meth:`stage_dir` (already local)."""

    def publish(self, name: str) -> None:
        """Share a finished stage's files (nothing to do locally)."""

    def finish(self, status: str) -> None:
        """End the run's shared record (nothing to do locally)."""


class MlflowState(LocalState):
    """Stage state and files in the MLflow run tagged with ``key`` (see the module docstring)."""

    def __init__(self, run_dir: Path, *, tracking_uri: str, experiment: str, key: str,
                 tags: dict[str, str], state_dir: Path):
        import mlflow

        from dbspec.tracking.mlflow_tracking import (check_tracking_server, ensure_experiment,
                                                     quiet_mlflow)

        super().__init__(state_dir_of(run_dir, key))
        quiet_mlflow()
        check_tracking_server(tracking_uri)  # before any stage runs, not minutes into one
        self.client = mlflow.MlflowClient(tracking_uri=tracking_uri)
        self.tracking_uri = tracking_uri
        self.key = key
        self.tags = tags
        self._run_id: Optional[str] = None
        with self._tracking(f"experiment '{experiment}'"):
            self.experiment_id = ensure_experiment(self.client, experiment, state_dir)

    @contextlib.contextmanager
    def _tracking(self, what: str) -> Iterator[None]:
        """Any failure of the tracking store while reading or writing ``what`` becomes a
        one-line :class:`StateError` (never "nothing ran", never a traceback)."""
        try:
            yield
        except DbspecError:
            raise
        except Exception as exc:
            text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            where = f"MLflow run {self._run_id}" if self._run_id else "MLflow"
            raise StateError(f"--run-key {self.key}: cannot use {what} in {where} at "
                             f"{self.tracking_uri}: {type(exc).__name__}"
                             + (f": {text}" if text else "")
                             + " (no stage was redone; run the task again once the tracking "
                               "store answers)") from None

    @property
    def run_id(self) -> str:
        """The pipeline run of this key: found by its tag, or created."""
        if self._run_id is None:
            from dbspec.tracking.mlflow_tracking import process_tags

            with self._tracking("the pipeline run"):
                found = self.client.search_runs(
                    [self.experiment_id], f"tags.`dbspec.run_key` = '{quoted(self.key)}'",
                    max_results=2)
                if found:
                    self._run_id = found[0].info.run_id
                elif self.key == os.environ.get("DBSPEC_PLATFORM_RUN"):  # AI Runtime's run
                    self.client.set_tag(self.key, "dbspec.run_key", self.key)
                    for name, value in {"dbspec.kind": "pipeline", **self.tags}.items():
                        self.client.set_tag(self.key, name, value)
                    self._run_id = self.key
                else:
                    run = self.client.create_run(
                        self.experiment_id, run_name=f"dbspec pipeline {self.key}",
                        tags={"dbspec.run_key": self.key, "dbspec.kind": "pipeline",
                              **self.tags, **process_tags()})
                    self._run_id = run.info.run_id
        return self._run_id

    # The state of a run key lives in MLflow, one pipeline run per key: its stage folders are
    # plain, one per stage, as before the stage cache (a key is not rerun with other specs).
    def stage_dir(self, name: str) -> Path:
        return inside(self.run_dir / "stages", name)

    def tidy(self) -> None:
        pass

    def holds(self, name: str, fingerprint: str) -> bool:
        return True

    def reuse(self, name: str, fingerprint: str,
              inputs: dict[str, str]) -> Optional[StageEntry]:
        return None

    def use(self, name: str, fingerprint: str) -> None:
        pass

    def prepare(self, name: str, fingerprint: str, *, resume: bool) -> Path:
        directory = self.stage_dir(name)
        if not resume and directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def keep(self, name: str, entry: StageEntry) -> None:
        pass

    def evict(self, state: RunState, keep: int) -> list[Removal]:
        return []

    def load(self) -> RunState:
        """The recorded stages; empty only when no stage of this key saved anything yet.

        Raises:
            StateError: the store failed, or a recorded entry cannot be read.
        """
        stages: dict[str, StageEntry] = {}
        with self._tracking("the stage state"):
            if not self._has_artifacts("dbspec", "state"):  # no stage has saved anything yet
                return RunState()
        with tempfile.TemporaryDirectory() as tmp:
            local = self._download("dbspec/state", Path(tmp), what="the stage state")
            for path in sorted(local.glob("*.json")):
                try:
                    entry = json.loads(path.read_text())
                    problem = "" if isinstance(entry, dict) else "is not a JSON object"
                except (OSError, ValueError) as exc:
                    problem = f"is unreadable ({exc})"
                if problem:
                    raise StateError(f"--run-key {self.key}: the recorded state of stage "
                                     f"'{path.stem}' in MLflow run {self.run_id} {problem}; "
                                     "rerun with a new --run-key") from None
                if entry.get("status") != "invalidated":
                    stages[path.stem] = StageEntry.from_json(entry)
        return RunState(stages)

    def save(self, state: RunState, changed: Iterable[str] = ()) -> None:
        with tempfile.TemporaryDirectory() as tmp, self._tracking("the stage state"):
            for name in changed:
                entry = state.entry(name)
                recorded = entry.to_json() if entry is not None else {"status": "invalidated"}
                path = Path(tmp) / f"{name}.json"
                path.write_text(json.dumps(recorded, indent=2, default=str))
                self.client.log_artifact(self.run_id, str(path), "dbspec/state")

    def fetch(self, names: Iterable[str]) -> None:
        for name in names:
            target = self.stage_dir(name)
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            with self._tracking(f"the files of stage '{name}'"):
                if not self._has_artifacts("dbspec/stages", name):  # it wrote no files
                    continue
            scratch = inside(target.parent, f".{name}.download")
            local = self._download(f"dbspec/stages/{name}", scratch,
                                   what=f"the files of stage '{name}'")
            for item in local.iterdir():
                shutil.move(str(item), target / item.name)
            shutil.rmtree(scratch, ignore_errors=True)

    def _has_artifacts(self, parent: str, name: str) -> bool:
        listed = self.client.list_artifacts(self.run_id, parent)
        return any(item.path == f"{parent}/{name}" for item in listed)

    def _download(self, path: str, destination: Path, *, what: str) -> Path:
        """Through MLflow's artifact API, so a proxying server or cloud store works the same
        as a local directory (never through the path of the run's artifact URI)."""
        from mlflow.exceptions import MlflowException

        try:
            destination.mkdir(parents=True, exist_ok=True)
            return Path(self.client.download_artifacts(self.run_id, path, str(destination)))
        except (MlflowException, OSError) as exc:
            raise DbspecError(f"cannot fetch {what} from MLflow run {self.run_id}: "
                              f"{str(exc).splitlines()[0] if str(exc) else exc!r}") from None

    def publish(self, name: str) -> None:
        directory = self.stage_dir(name)
        with self._tracking(f"the files of stage '{name}'"):
            for path in sorted(directory.rglob("*")):
                relative = path.relative_to(directory)
                if path.is_dir() or relative.parts[0] in _LOCAL_ONLY:
                    continue
                where = "/".join(("dbspec", "stages", name, *relative.parts[:-1]))
                self.client.log_artifact(self.run_id, str(path), where)

    def finish(self, status: str) -> None:
        with self._tracking("the pipeline run"):
            self.client.set_terminated(self.run_id, status)


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in key)[:80]

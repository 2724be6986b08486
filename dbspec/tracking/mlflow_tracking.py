"""One place that talks to MLflow tracking for a dbspec run.

Default store: SQLite and artifacts under ``.dbspec/``; ``MLFLOW_TRACKING_URI`` wins over the
spec. Metrics are buffered (:class:`~dbspec.tracking.metrics.MetricBuffer`) and flushed on
every way out of :meth:`Tracker.run`; a SIGKILL loses the buffer, and a resumed training logs
the lost epochs from its checkpoint (:meth:`Tracker.log_missing_epochs`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Iterator, Optional

from dbspec.processes import process_alive  # noqa: F401  (imported from here too)
from dbspec.spec.sections import Spec
from dbspec.tracking.metrics import MetricBuffer
# the store checks live in stores.py; these names are imported from here too
from dbspec.tracking.stores import (TrackingError, check_tracking_server,  # noqa: F401
                                    quiet_mlflow)

_PARAM_LIMIT = 6000
#: The longest dataset schema (JSON) an MLflow store takes: 1,048,575 characters (mlflow 3.17
#: refuses more with "'schema' exceeds the maximum length of 1048575 characters").
DATASET_SCHEMA_LIMIT = 1_048_575
#: The widest input example logged with a model (see :func:`served_example`).
EXAMPLE_COLUMNS_LIMIT = 2_000
_FLUSH_SECONDS = 5.0


def process_tags() -> dict[str, str]:
    """This process's ``dbspec.pid`` and ``dbspec.host``: a later run ends a run whose process
    died as KILLED (:func:`dbspec.executors.recovery.end_dead_runs`)."""
    return {"dbspec.pid": str(os.getpid()), "dbspec.host": socket.gethostname()}


def resolve_tracking_uri(spec: Spec, state_dir: Path) -> str:
    """``MLFLOW_TRACKING_URI`` > ``tracking.tracking_uri`` > SQLite under the state dir."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or spec.tracking.tracking_uri
    if uri:
        return uri
    state_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(state_dir / 'mlflow.db').resolve()}"


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``; lists keep their index."""
    out: dict[str, str] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(data, list) and data and all(isinstance(v, (dict, list)) for v in data):
        for index, value in enumerate(data):
            out.update(flatten(value, f"{prefix}{index}."))
    else:
        out[prefix[:-1]] = str(data)[:_PARAM_LIMIT]
    return out


class Tracker:
    """MLflow experiment, run and logging for one spec; ``state_dir`` is the run's ``.dbspec``
    (the default store and artifacts), ``experiment`` a name override (smoke runs)."""

    def __init__(self, spec: Spec, state_dir: Path, *, experiment: Optional[str] = None):
        import mlflow

        quiet_mlflow()
        self.spec = spec
        self.tracking_uri = resolve_tracking_uri(spec, state_dir)
        check_tracking_server(self.tracking_uri)
        mlflow.set_tracking_uri(self.tracking_uri)
        if spec.tracking.registry_uri:
            mlflow.set_registry_uri(spec.tracking.registry_uri)
        self.client = mlflow.MlflowClient()
        self.experiment_name = experiment or spec.tracking.experiment or spec.name
        self.experiment_id = ensure_experiment(self.client, self.experiment_name, state_dir)
        self._metrics: Optional[MetricBuffer] = None
        self._logged: dict[str, set[int]] = {}  # steps MLflow had when a resumed run re-opened
        self.run_id: Optional[str] = None

    @contextlib.contextmanager
    def run(self, run_id: Optional[str] = None, *, tags: Optional[dict[str, str]] = None,
            system_metrics: bool = False) -> Iterator[str]:
        """Start (or re-open) the run, tagged with :func:`process_tags`; end it, after
        flushing the metrics, FAILED on an exception, KILLED on Ctrl-C or SIGTERM.

        MLflow's system-metrics sampler runs when ``system_metrics`` asks or
        ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING`` is on; by default dbspec's monitor samples.
        """
        import mlflow
        from mlflow.environment_variables import MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING

        sampled = system_metrics or MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING.get()
        if sampled:
            mlflow.set_system_metrics_sampling_interval(
                self.spec.tracking.system_metrics_interval)
        active = mlflow.start_run(run_id=run_id, experiment_id=self.experiment_id,
                                  run_name=None if run_id else self.spec.tracking.run_name,
                                  tags={**(tags or {}), **process_tags()},
                                  log_system_metrics=sampled)
        self.run_id = active.info.run_id
        self._metrics = MetricBuffer(self.client, self.run_id, flush_seconds=_FLUSH_SECONDS)
        self._logged = {}
        status = "FINISHED"
        try:
            yield self.run_id
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        except BaseException:
            status = "FAILED"
            raise
        finally:
            try:
                self.flush()
            except BaseException:
                status = "FAILED" if status == "FINISHED" else status
                raise
            finally:
                mlflow.end_run(status=status)

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        from dbspec.errors import redact

        # environment values a template read are logged as {{ env.NAME }}, never the value
        self.client.log_batch(self.run_id, params=[Param(redact(k)[:250], redact(v))
                                                   for k, v in params.items()])

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        """Buffer metrics of the run at ``step``, stamped now (TrackingError: outside a run)."""
        if self._metrics is None:
            raise TrackingError("metrics logged outside a run: start Tracker.run first")
        self._metrics.log(metrics, step)

    def flush(self) -> None:
        """Send the buffered metrics and wait until the store has them."""
        if self._metrics is not None:
            self._metrics.flush()

    def logged_steps(self) -> dict[str, set[int]]:
        """The steps each metric of the run has in MLflow."""
        keys = self.client.get_run(self.run_id).data.metrics
        return {key: {m.step for m in self.client.get_metric_history(self.run_id, key)}
                for key in keys}

    def resume_epochs(self) -> None:
        """Remember the steps MLflow has, so :meth:`log_epoch` does not log again the epochs a
        killed run flushed after the checkpoint it resumes from."""
        self._logged = self.logged_steps()

    def log_epoch(self, metrics: dict[str, float], epoch: int) -> None:
        """Buffer one epoch's metrics at step ``epoch``, but none that MLflow had when
        :meth:`resume_epochs` looked."""
        self.log_metrics({k: v for k, v in metrics.items()
                          if epoch not in self._logged.get(k, ())}, step=epoch)

    def log_missing_epochs(self, history: list[dict[str, float]]) -> int:
        """Log every epoch of ``history`` (epoch ``i`` at step ``i``) that MLflow lacks (a
        SIGKILL lost the buffer; the checkpoint still has them); returns how many values."""
        self.flush()
        logged = self.logged_steps()
        missing = 0
        for epoch, metrics in enumerate(history):
            fresh = {k: v for k, v in metrics.items() if epoch not in logged.get(k, ())}
            if fresh:
                missing += len(fresh)
                self.log_metrics(fresh, step=epoch)
        self.flush()
        return missing

    def log_artifact(self, path: Path, artifact_path: Optional[str] = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_dataset(self, frame, *, source: str, target: str, version: str, name: str) -> None:
        import mlflow
        from mlflow.data.code_dataset_source import CodeDatasetSource
        from mlflow.data.dataset_source_registry import get_dataset_source_from_json

        # the source made explicitly: from a path MLflow finds two equal "local" kinds and warns
        located: Any = get_dataset_source_from_json(json.dumps({"uri": source}), "local")
        if not Path(source).exists():  # built-in and generated data have no file to point at
            located = CodeDatasetSource({"dbspec.source": source, "dbspec.version": version})
        with warnings.catch_warnings():
            # integer class labels are by design; MLflow's hint about missing values in
            # integer columns does not apply to them
            warnings.filterwarnings("ignore", message=".*Inferred schema contains integer")
            dataset = mlflow.data.from_pandas(frame, source=located, targets=target, name=name,
                                              digest=dataset_digest(frame, version))
            dataset.__dict__["schema"] = dataset_schema(frame)  # the cached_property's slot
            size = len(dataset.to_dict()["schema"] or "")  # what the store measures
            if size > DATASET_SCHEMA_LIMIT:  # refused after training, the run lost: log without
                dataset.__dict__["schema"] = None
                print(f"  warning: the dataset is logged without its schema: {len(frame.columns):,}"
                      f" columns make {size:,} characters, over MLflow's {DATASET_SCHEMA_LIMIT:,}",
                      file=sys.stderr, flush=True)
            mlflow.log_input(dataset, context="training", tags={"data_version": version})

    def log_model(self, served_dir: Path, example, prediction, *,
                  out_of_range: tuple[str, float] = ("warn", 0.5)) -> str:
        """Log the served model as a self-contained pyfunc (the dbspec modules it imports and a
        ``model.custom`` class's module travel as code paths; requirements are pins without
        local version labels) with signature (:func:`_input_schema`) and input example.
        ``out_of_range``: the spec's ``serving.out_of_range`` (action, tolerance), which the
        pyfunc applies on every path (``load_model(...).predict``, ``spark_udf``, serving).

        Returns:
            Its logged-model URI, ``models:/<model_id>`` (what ``Registry.register`` takes).

        Raises:
            PortabilityError: the custom class lives where it cannot travel (``__main__``, ...).
        """
        import tempfile

        import mlflow
        from mlflow.models import ModelSignature, infer_signature
        from packaging.utils import canonicalize_name

        from dbspec.models import pyfunc
        from dbspec.models.portable import copy_served_code, custom_code, pin

        card = json.loads((Path(served_dir) / "model.json").read_text())
        custom = custom_code(card["model"])  # refuses before anything is logged
        requirements = [pin(dist) for dist in ("torch", "pandas", "numpy", "pydantic", "PyYAML")]
        known = {canonicalize_name(r.split("==")[0]) for r in requirements}
        requirements += [r for r in custom.requirements
                         if canonicalize_name(r.split("==")[0]) not in known]
        inputs_schema, features = _input_schema(card)
        if card.get("inputs"):  # Pillow for images, tokenizers for subword text
            from dbspec.models.encoding import required_packages

            requirements += [pin(dist) for dist in required_packages(card["inputs"])]
        with tempfile.TemporaryDirectory(prefix="dbspec-code-") as staging, \
                warnings.catch_warnings():
            # class labels are integers by design; MLflow's hint about missing values in
            # integer columns does not apply to a prediction column
            warnings.filterwarnings("ignore", message=".*Inferred schema contains integer")
            dbspec_code = copy_served_code(Path(staging),
                                           [pyfunc.__name__, *custom.dbspec_modules])
            info = mlflow.pyfunc.log_model(
                name="model", python_model=pyfunc.__file__,
                artifacts={"served_model": str(served_dir)},
                code_paths=[dbspec_code, *custom.code_paths],
                signature=ModelSignature(
                    inputs=inputs_schema,
                    outputs=infer_signature(example, prediction).outputs),
                input_example=served_example(example), metadata={"dbspec_features": features},
                model_config=pyfunc.out_of_range_config(*out_of_range),
                pip_requirements=requirements)
        return info.model_uri


def served_example(example):
    """The input example, or None for one too wide for MLflow to check it in time (it checks
    column by column: 16 s at 5,000 columns, 86 s at 20,000, mlflow 3.17)."""
    if len(example.columns) <= EXAMPLE_COLUMNS_LIMIT:
        return example
    print(f"  warning: the model is logged without an input example: {len(example.columns):,} "
          f"columns, over {EXAMPLE_COLUMNS_LIMIT:,}; its signature describes the input", file=sys.stderr,
          flush=True)
    return None


def _input_schema(card: dict):
    """The signature's inputs and the feature names for the metadata: unnamed doubles for a
    numeric model (a named signature would make MLflow refuse positional input before the model
    sees it); a model with typed features takes its columns by name only, each with its type."""
    from mlflow.types import ColSpec, DataType, Schema
    from mlflow.types.schema import Array

    inputs = card.get("inputs")
    if inputs:
        from dbspec.models.card import has_typed_inputs
        from dbspec.models.encoding import raw_columns, signature_types

        if has_typed_inputs(inputs):  # a sequence is an array<type>
            specs = [ColSpec(Array(DataType[kind[len("array<"):-1]])
                             if kind.startswith("array<") else kind, name)
                     for name, kind in signature_types(inputs)]
            return Schema(specs), raw_columns(inputs)
    return Schema([ColSpec("double") for _ in card["feature_names"]]), card["feature_names"]


class _QuietDownloads:  # what overlapping artifact_progress_bars_off blocks share
    lock, depth, owns_variable = threading.Lock(), 0, False


@contextlib.contextmanager
def artifact_progress_bars_off() -> Iterator[None]:
    """No tqdm bars while dbspec itself downloads a model. MLflow has no per-call switch, so
    ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR`` is false for the block, unset after the last
    overlapping one (the caller's downloads keep their bars); a value already set stays."""
    name, shared = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", _QuietDownloads
    with shared.lock:
        if shared.depth == 0 and name not in os.environ:
            os.environ[name], shared.owns_variable = "false", True
        shared.depth += 1
    try:
        yield
    finally:
        with shared.lock:
            shared.depth -= 1
            if shared.depth == 0 and shared.owns_variable:
                os.environ.pop(name, None)
                shared.owns_variable = False


def dataset_digest(frame, version: str) -> str:
    """The logged dataset's digest: the data version (which names the content) with the
    frame's shape. MLflow's own hashes every value: 29 s for 70,000 x 2,508 (one-hot) each run."""
    import hashlib

    key = json.dumps([version, len(frame), [str(c) for c in frame.columns]])
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def dataset_schema(frame, sample_rows: int = 1000):
    """The MLflow schema of ``frame``, as ``mlflow.data.from_pandas`` infers it, in ms: types
    from a sample, optional columns from all rows at once (MLflow tests each value in Python:
    54 s for 200,000 x 100 on monitoring_synthetic.yaml)."""
    from mlflow.models import infer_signature
    from mlflow.types import ColSpec, Schema

    sampled = infer_signature(frame.head(sample_rows)).inputs
    missing = frame.isna().any()
    return Schema([ColSpec(spec.type, spec.name, required=not bool(missing[spec.name]))
                   for spec in sampled.inputs])


def ensure_experiment(client, name: str, state_dir: Path) -> str:
    """The id of experiment ``name``, created if missing (a local store's artifacts under
    ``state_dir/mlartifacts``)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    if client.tracking_uri.startswith(("sqlite:", "file:")):
        artifacts = (state_dir / "mlartifacts").resolve()
        artifacts.mkdir(parents=True, exist_ok=True)
        location = artifacts.as_uri()
    return client.create_experiment(name, artifact_location=location)

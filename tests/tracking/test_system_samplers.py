"""One system sampler by default: dbspec's monitor; MLflow's only when asked for."""

from __future__ import annotations

import pytest

SPEC = """\
name: sampled
data: {source: {kind: sklearn, name: diabetes}, task: regression}
model: {layers: [{linear: {out: 1}}]}
"""


def samplers(workdir, extra: str = "") -> set[str]:
    """Which samplers a training of the spec starts, as the train stage starts them."""
    import mlflow.tracking.fluent as fluent

    from dbspec.observability.observer import TrainingObserver
    from dbspec.spec.loader import load_spec
    from dbspec.tracking.mlflow_tracking import Tracker

    (workdir / "spec.yaml").write_text(SPEC + extra)
    spec = load_spec("spec.yaml").spec
    tracker = Tracker(spec, workdir / ".dbspec")
    running = set()
    with tracker.run(system_metrics=spec.tracking.system_metrics) as run_id, \
            TrainingObserver(spec, say=lambda text: None) as observer:
        if run_id in fluent.run_id_to_system_metrics_monitor:
            running.add("mlflow")
        if observer.monitor is not None:
            running.add("dbspec")
    return running


def test_by_default_only_dbspec_s_monitor_samples(workdir, monkeypatch):
    monkeypatch.delenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", raising=False)
    assert samplers(workdir) == {"dbspec"}


@pytest.mark.parametrize("extra, env", [
    ("tracking: {system_metrics: true}\n", None),
    ("", "true"),
])
def test_mlflow_s_sampler_runs_when_asked_for(workdir, monkeypatch, extra, env):
    if env is None:
        monkeypatch.delenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", env)
    assert samplers(workdir, extra) == {"dbspec", "mlflow"}


def test_mlflow_s_sampler_alone_when_the_monitor_is_off(workdir, monkeypatch):
    monkeypatch.delenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", raising=False)
    assert samplers(workdir, "tracking: {system_metrics: true, monitor: false}\n") == {"mlflow"}

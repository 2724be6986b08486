"""A spec run with TensorBoard and monitoring on: event files readable by TensorBoard's own
reader, monitor metrics in MLflow, a diagnosis in the summary and as a run tag."""

from __future__ import annotations

import json

import pytest

from tests.conftest import MINIMAL, checkout_env, run_cli, run_in_process

OBSERVED = MINIMAL + """\
training: {epochs: 6, batch_size: 64}
tracking:
  tensorboard: {histograms: true, graph: true}
  monitor_interval: 0.05
registry: {name: observed_model}
"""


@pytest.fixture(scope="module")
def observed_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("observed")
    (workdir / "spec.yaml").write_text(OBSERVED)
    # a process of its own, as a user's run: its output is checked whole (the GPU notice once);
    # the commands below, whose output alone is checked, run the CLI in this process
    result = run_cli("run", "spec.yaml", "--summary-json", "summary.json", cwd=workdir,
                     env={"MLFLOW_TRACKING_URI": ""}, timeout=600)  # 120 s ran out under load
    assert result.returncode == 0, result.stderr
    return workdir, json.loads((workdir / "summary.json").read_text()), result


def test_event_files_are_readable_by_tensorboard(observed_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    workdir, summary, _ = observed_run
    fetched = run_in_process("tensorboard", "spec.yaml", "--logdir-only", cwd=workdir,
                             env={"MLFLOW_TRACKING_URI": ""})
    assert fetched.returncode == 0, fetched.stderr
    logdir = fetched.stdout.strip()
    assert summary["run_id"] in logdir
    events = EventAccumulator(logdir, size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    tags = events.Tags()
    assert {"loss/train", "loss/val", "optim/lr", "speed/samples_per_second",
            "system/process_cpu_percent"} <= set(tags["scalars"])
    train_loss = events.Scalars("loss/train")
    assert [e.step for e in train_loss] == [1, 2, 3, 4, 5, 6]
    assert train_loss[-1].value < train_loss[0].value
    assert any(t.startswith("weights/") for t in tags["histograms"])
    assert any(t.startswith("gradients/") for t in tags["histograms"])
    assert tags["graph"]


def test_monitor_metrics_and_the_diagnosis_reach_mlflow(observed_run):
    import mlflow

    workdir, summary, result = observed_run
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}")
    run = client.get_run(summary["run_id"])
    for name in ("process_cpu_percent", "system_memory_percent", "process_rss_mb",
                 "step_time_ms", "data_seconds", "samples_per_second"):
        history = client.get_metric_history(summary["run_id"], name)
        assert [m.step for m in history] == list(range(6)), name
    assert summary["diagnosis"] and run.data.tags["dbspec.bottlenecks"].startswith(
        summary["diagnosis"][0])
    assert "diagnosis" in result.stdout
    # a CPU-content spec (device: auto) misses nothing, with a GPU or without: no notice
    assert "GPU metrics unavailable" not in result.stderr


@pytest.mark.parametrize("compute, said", [
    ({"kind": "single_gpu"}, 1), ({"kind": "local", "device": "cuda"}, 1),
    ({"kind": "deepspeed"}, 1), ({"kind": "local"}, 0),
    ({"kind": "deepspeed", "use_gpu": False}, 0), ({"kind": "torch_distributor"}, 0)])
def test_missing_gpu_metrics_are_told_once_when_a_gpu_was_asked_for(compute, said, monkeypatch):
    from dbspec.observability import observer
    from dbspec.observability.resources import GpuProbe
    from dbspec.spec.sections import Spec

    spec = Spec.model_validate({
        "name": "gpu-notice", "data": {"source": {"kind": "sklearn", "name": "diabetes"},
                                       "task": "regression"},
        "model": {"layers": [{"linear": {"out": 1}}]}, "compute": compute,
        "tracking": {"monitor": True, "monitor_interval": 60}})
    monkeypatch.setattr(observer, "_TOLD", False)
    told: list[str] = []
    for _ in range(2):
        with observer.TrainingObserver(spec, say=told.append):
            pass
    # the notice is about a GPU that cannot be read: where NVML does see one, nothing is said
    if GpuProbe().unavailable is None:
        said = 0
    assert len([t for t in told if "GPU metrics unavailable" in t]) == said, told


def test_tensorboard_command_errors(observed_run, tmp_path):
    workdir, summary, _ = observed_run
    env = {"MLFLOW_TRACKING_URI": ""}
    missing = run_in_process("tensorboard", "0123456789abcdef", "--logdir-only", cwd=workdir,
                             env=env)
    assert missing.returncode == 1 and "no MLflow run 0123456789abcdef" in missing.stderr
    (tmp_path / "spec.yaml").write_text(OBSERVED)
    never = run_in_process("tensorboard", "spec.yaml", cwd=tmp_path, env=env)
    assert never.returncode == 1 and "no finished training" in never.stderr
    port = run_in_process("tensorboard", "spec.yaml", "--port", "70000", cwd=workdir, env=env)
    assert port.returncode == 2 and "--port must be between" in port.stderr


def test_tensorboard_finds_a_smoke_training(workdir):
    (workdir / "s.yaml").write_text(MINIMAL + "tracking: {tensorboard: true}\n")
    assert run_in_process("run", "s.yaml", "-q", "--smoke", cwd=workdir).returncode == 0
    found = run_in_process("tensorboard", "s.yaml", "--logdir-only", cwd=workdir)
    assert found.returncode == 0, found.stderr
    assert "showing its --smoke training (there is no full one)" in found.stderr
    assert list((workdir / found.stdout.strip()).rglob("events.out.tfevents.*"))
    asked = run_in_process("tensorboard", "s.yaml", "--logdir-only", "--smoke", cwd=workdir)
    assert asked.returncode == 0 and asked.stdout == found.stdout


def test_a_run_without_tensorboard_has_no_event_files(workdir, write_spec):
    (workdir / "s.yaml").write_text(MINIMAL + "training: {epochs: 2}\n")
    assert run_in_process("run", "s.yaml", "-q", cwd=workdir).returncode == 0
    result = run_in_process("tensorboard", "s.yaml", "--logdir-only", cwd=workdir)
    assert result.returncode == 1 and "set tracking.tensorboard: true" in result.stderr


def test_cuda_out_of_memory_retries_at_half_the_batch(monkeypatch, tmp_path):
    """A CUDA out-of-memory error cannot happen on this CPU-only machine: here the training
    function raises torch's own OutOfMemoryError while the batch is over 16 rows."""
    import torch

    import dbspec.training.loop as loop
    from dbspec.seams.sources import source_kind
    from dbspec.observability.observer import TrainingObserver
    from dbspec.spec.loader import load_spec
    from dbspec.training.fit import FitOptions, fit_spec

    real, tried = loop.train, []

    def train(network, tensors, training, **kwargs):
        tried.append(training.batch_size)
        if training.batch_size > 16:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(network, tensors, training, **kwargs)

    monkeypatch.setattr(loop, "train", train)
    path = tmp_path / "s.yaml"
    path.write_text(MINIMAL + "training: {epochs: 2, batch_size: 64, auto_batch_size: true}\n")
    spec = load_spec(str(path)).spec
    source = source_kind(spec.data).read(spec.data, base=tmp_path)
    table, splits, fitted = _prepared(spec, source)
    with TrainingObserver(spec) as observer:
        result = fit_spec(spec, table, splits, fitted, FitOptions(observer=observer))
        findings = observer.finish(device="cuda", threads=1, batch_size=result.batch_size)
    assert tried == [64, 32, 16] and result.batch_size == 16
    assert findings[0].code == "oom"
    assert "at batch size 64, 32; training went on at 16" in findings[0].message
    path.write_text(MINIMAL + "training: {epochs: 2, batch_size: 64}\n")
    spec = load_spec(str(path)).spec
    with pytest.raises(loop.TrainingError, match="CUDA ran out of memory at batch size 64"):
        fit_spec(spec, table, splits, fitted)


def _prepared(spec, source):
    from dbspec.data.prepare import build_table, fit_preprocessing, split_rows

    table = build_table(source.frame, spec.data)
    splits = split_rows(table, spec.data)
    return table, splits, fit_preprocessing(spec.data, table, splits.train)


def test_tensorboard_command_serves_the_run_on_loopback(observed_run):
    import signal
    import socket
    import subprocess
    import sys
    import time

    import httpx

    workdir, summary, _ = observed_run
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = checkout_env({"MLFLOW_TRACKING_URI": ""})
    server = subprocess.Popen([sys.executable, "-m", "dbspec", "tensorboard", "spec.yaml",
                               "--port", str(port)], cwd=workdir, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/data/runs", timeout=2)
                if answer.status_code == 200 and answer.json():
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, server.stderr.read()
            time.sleep(0.5)
        assert answer.json()  # TensorBoard found the run's event files
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)


def test_the_learning_curve_diagnosis_reaches_the_summary_run_and_version(observed_run):
    import mlflow

    from dbspec.evaluation.curves import LABELS

    workdir, summary, result = observed_run
    curve = summary["learning_curve"]
    assert curve["label"] in LABELS and curve["epochs"] == 6
    # standardised targets: always predicting the training mean scores an MSE of about 1
    assert 0.9 < curve["baseline_loss"] < 1.1
    assert f"learning curves  {curve['label']}: " in result.stdout
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}")
    run = client.get_run(summary["run_id"])
    assert run.data.tags["dbspec.diagnosis"] == curve["label"]
    assert run.data.tags["dbspec.diagnosis.detail"].startswith(f"{curve['label']}: ")
    version = client.get_model_version("observed_model", summary["model_version"])
    assert version.tags["dbspec.diagnosis"] == curve["label"]

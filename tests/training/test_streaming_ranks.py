"""Regressions from the review of streamed training (issue 18) under several ranks: real
``dbspec run`` on local Spark, TorchDistributor's gloo ranks and DeepSpeed on the CPU.

- batch norm on a training split whose smaller rank's rows % batch == 1: the rank skipped its
  one-row last batch while the other ran it, and DDP's collectives waited for ever;
- a DDP run killed mid-epoch and resumed: every rank restored rank 0's loss so far;
- DeepSpeed with gradient accumulation over an odd step count, killed mid-epoch and resumed: a
  step checkpoint was taken in the middle of DeepSpeed's own accumulation, whose gradient the
  resume lost; so is the checkpoint at the end of such an epoch (``from-the-epoch-end``: it
  fails as long as that holds).

A run that is killed, or that could hang, runs in a process group of its own, killed whole
(Spark's JVM and the ranks with it). Nothing is mocked.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import checkout_env, run_in_process
from tests.training.test_streaming_runs import history_of, state_of, write_table

pytestmark = pytest.mark.slow

BATCH = 64


def spec_text(name: str, table: Path, *, layers: list, training: dict, compute: dict) -> str:
    """A small network on the streamed table, one torch thread (deterministic on the CPU)."""
    spec = {
        "name": name,
        "data": {"source": {"kind": "delta", "path": str(table)}, "task": "regression",
                 "preprocessing": ["standard_scale"],
                 "streaming": {"enabled": True, "shuffle_window": 1}},
        "model": {"layers": layers},
        "training": {"optimizer": {"name": "adam", "lr": 0.01}, "batch_size": BATCH,
                     "num_threads": 1, **training},
        "compute": compute,
        "tracking": {"system_metrics": False},
    }
    return yaml.safe_dump(spec, sort_keys=False)


def train_rows(text: str, rows: int) -> int:
    """The training rows of a table of ``rows`` rows under the spec's hash split."""
    from dbspec.data.shards import hash_split_rows
    from dbspec.spec.sections.data import DataSpec

    data = DataSpec.model_validate(yaml.safe_load(text)["data"])
    return int((hash_split_rows(data, np.arange(rows)) == 0).sum())


def project(root: Path, name: str, text: str) -> Path:
    directory = root / name
    directory.mkdir()
    (directory / "spec.yaml").write_text(text)
    return directory


def run_ok(directory: Path, *args: str, timeout: int = 300):
    done = run_in_process("run", "spec.yaml", "-q", *args, cwd=directory, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _start(args: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    """``python -m dbspec ARGS`` in a session of its own (its group is killed whole)."""
    return subprocess.Popen([sys.executable, "-m", "dbspec", *args], cwd=cwd,
                            env=checkout_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def kill_group(process: subprocess.Popen) -> str:
    """SIGKILL the process's whole group (Spark's JVM, torchrun and the ranks); returns what
    it printed."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    output, _ = process.communicate(timeout=60)
    return output or ""


def run_detached(directory: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """``dbspec run spec.yaml ARGS`` in its own process group; a run still going after
    ``timeout`` seconds (ranks waiting on each other) is killed with its ranks and fails the
    test."""
    process = _start(["run", "spec.yaml", "-q", *args], directory, {})
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        output = kill_group(process)
        raise AssertionError(f"dbspec run still ran after {timeout:.0f} s (ranks waiting on "
                             f"each other?):\n{output[-4000:]}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, output, "")


def run_until_paused(directory: Path, point: str, *, timeout: float = 240) -> subprocess.Popen:
    """``dbspec run`` in its own process group, returned once a rank sleeps at ``point``
    (a comma-separated list: the first reached). Every rank pauses there; the marker holds
    the last one's pid, so the test kills the group, not a pid."""
    marker = directory / "paused"
    marker.unlink(missing_ok=True)
    process = _start(["run", "spec.yaml", "-q"], directory,
                     {"DBSPEC_PAUSE_AT": point, "DBSPEC_PAUSE_FILE": str(marker)})
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if process.poll() is not None:
            raise AssertionError(f"the run exited {process.returncode} before {point}:\n"
                                 f"{process.stdout.read()[-4000:]}")
        if time.monotonic() > deadline:
            output = kill_group(process)
            raise AssertionError(f"the run did not reach {point} in {timeout:.0f} s:\n"
                                 f"{output[-4000:]}")
        time.sleep(0.1)
    return process


def checkpoint_names(directory: Path, name: str) -> list[str]:
    checkpoints = directory / ".dbspec/runs" / name / "stages/train/checkpoints"
    return sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("epoch-"))


DDP = {"kind": "torch_distributor", "num_processes": 2, "use_gpu": False, "local_mode": True}
MLP = [{"linear": {"out": 16}}, "relu", {"linear": {"out": 1}}]
BATCH_NORM_MLP = [{"linear": {"out": 16}}, {"batchnorm1d": {}}, "relu", {"linear": {"out": 1}}]
#: Past this a run is taken to hang (a fixed run takes 25-40 s on 2 loaded cores).
HANG_SECONDS = 300


@pytest.fixture(scope="module")
def odd_table(tmp_path_factory):
    """A table whose training split has 2 x (64 k + 1) + 1 rows: ranks of 64 k + 1 and
    64 k + 2 rows, so the smaller one's rows % 64 == 1 (its last batch had one row)."""
    root = tmp_path_factory.mktemp("ranks-tables")
    probe = spec_text("probe", root / "odd", layers=MLP, training={}, compute=DDP)
    rows = next(n for n in range(3000, 4000) if train_rows(probe, n) % (2 * BATCH) == 3)
    return write_table(root / "odd", rows), rows


DDP_NAME = "ddp-batchnorm"


@pytest.fixture(scope="module")
def ddp_reference(odd_table, tmp_path_factory):
    """An uninterrupted streamed DDP run with batch norm on the odd table, 2 epochs with step
    checkpoints: ``(spec text, project directory, the finished process)``. One run serves
    both DDP tests (each such run costs ~30 s of Spark and rank start-up)."""
    table, _ = odd_table
    text = spec_text(DDP_NAME, table, layers=BATCH_NORM_MLP, compute=DDP,
                     training={"epochs": 2, "checkpointing": {"every_n_steps": 5}})
    directory = project(tmp_path_factory.mktemp("ddp-reference"), "reference", text)
    return text, directory, run_detached(directory, timeout=HANG_SECONDS)


# -- 13. batch norm, a smaller rank with rows % batch == 1 ------------------------------------

def test_ddp_with_batch_norm_finishes_when_a_rank_would_get_a_one_row_batch(odd_table,
                                                                             ddp_reference):
    _, rows = odd_table
    text, directory, done = ddp_reference
    train = train_rows(text, rows)
    assert train % 2 == 1 and (train // 2) % BATCH == 1  # the case under test
    assert done.returncode == 0, done.stdout[-4000:]
    stages = state_of(directory, DDP_NAME)
    assert stages["split"]["output"]["train"] == train
    assert stages["train"]["output"]["world_size"] == 2
    history = history_of(directory, DDP_NAME)
    assert len(history) == 2 and all(np.isfinite(e["train_loss"]) for e in history)


# -- 14. DDP killed mid-epoch, resumed ----------------------------------------------------------

def test_ddp_resumed_mid_epoch_has_the_uninterrupted_train_loss(tmp_path, odd_table,
                                                                ddp_reference):
    _, rows = odd_table
    text, reference, done = ddp_reference
    assert done.returncode == 0, done.stdout[-4000:]
    assert (train_rows(text, rows) // 2) // BATCH > 12
    expected = history_of(reference, DDP_NAME)
    killed = project(tmp_path, "killed", text)
    process = run_until_paused(killed, "train.step.1.12")
    try:
        names = checkpoint_names(killed, DDP_NAME)
    finally:
        kill_group(process)
    assert names == ["epoch-0.pt", "epoch-1-step-10.pt"], names
    run_ok(killed, "--resume")
    train = state_of(killed, DDP_NAME)["train"]["output"]
    assert train["resumed_from_epoch"] == 1 and train["epochs_run"] == 2
    history = history_of(killed, DDP_NAME)
    # every rank goes on from its own loss so far (rank 0's on every rank made the epoch's
    # mean another number)
    for key in ("train_loss", "val_loss"):
        assert [e[key] for e in history] == [e[key] for e in expected], key


# -- 15. DeepSpeed, accumulation over an odd step count, killed mid-epoch, resumed --------------

DS_NAME = "ds-resume"


@pytest.fixture(scope="module")
def ds_spec(odd_table):
    """A one-rank DeepSpeed spec accumulating 2 batches over an odd step count per epoch:
    DeepSpeed counts micro-steps over the whole run, so its accumulations close on odd steps
    of epoch 1 (0-based), where the loop's own step count would close them on even ones."""
    table, rows = odd_table
    text = spec_text(DS_NAME, table, layers=MLP,
                     compute={"kind": "deepspeed", "num_gpus": 1, "use_gpu": False,
                              "zero_stage": 2},
                     training={"epochs": 2, "gradient_accumulation": 2,
                               "checkpointing": {"every_n_steps": 4}})
    steps = -(-train_rows(text, rows) // BATCH)
    assert steps % 2 == 1 and steps > 12
    return text


@pytest.fixture
def no_compiled_ops(tmp_path, monkeypatch):
    """No DeepSpeed op is compiled (see tests/training/test_distributed.py)."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "torch_extensions"))


@pytest.fixture(scope="module")
def ds_reference(ds_spec, tmp_path_factory):
    """The uninterrupted DeepSpeed run's per-epoch history."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path_factory.mktemp("torch_extensions")))
        reference = project(tmp_path_factory.mktemp("ds-reference"), "reference", ds_spec)
        run_ok(reference)
    return history_of(reference, DS_NAME)


@pytest.mark.parametrize("points, newest", [
    # the fixed loop takes its chances to checkpoint on odd steps of epoch 1, the old one on
    # even ones: stop at whichever comes first after a step checkpoint was written (the old
    # loop's, at step 4, held half an accumulation, which the resume lost)
    ("train.step.1.7,train.step.1.8", r"epoch-1-step-\d+"),
    # before any step checkpoint of epoch 1: the resume starts from epoch 0's end, which
    # DeepSpeed saved in the middle of an accumulation too (epoch 0's last, odd, batch)
    ("train.step.1.1,train.step.1.2", r"epoch-0"),
], ids=["from-a-step-checkpoint", "from-the-epoch-end"])
def test_deepspeed_resumed_mid_epoch_has_the_uninterrupted_losses(
        tmp_path, ds_spec, ds_reference, no_compiled_ops, points, newest):
    killed = project(tmp_path, "killed", ds_spec)
    process = run_until_paused(killed, points)
    try:
        names = checkpoint_names(killed, DS_NAME)
    finally:
        kill_group(process)
    assert re.fullmatch(newest, names[-1]), names  # what the resume starts from
    run_ok(killed, "--resume")
    train = state_of(killed, DS_NAME)["train"]["output"]
    assert train["resumed_from_epoch"] == 1 and train["epochs_run"] == 2
    history = history_of(killed, DS_NAME)
    for key in ("val_loss", "train_loss"):
        assert [e[key] for e in history] == [e[key] for e in ds_reference], key

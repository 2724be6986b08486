"""A killed Parquet ``predict`` leaves the output readable, and the next run cleans up.

The kill is deterministic: a child process scores with a writer that pauses after its first
batch and says so; the test SIGKILLs it there, mid-write.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tests.conftest import checkout_env

FEATURES = ["a", "b"]


def fake_model():
    """A regression 'model' (the sum of the features) with the card predict_local reads."""
    import torch

    from dbspec.serving.app import LoadedModel

    class Summing(torch.nn.Module):
        card = SimpleNamespace(feature_names=FEATURES, task="regression")

        def forward(self, x):
            return x.sum(dim=1)

    return LoadedModel(Summing(), "fake", "1", "models:/fake/1")


def rows(n: int) -> pa.Table:
    return pa.table({"id": np.arange(n), "a": np.ones(n), "b": np.arange(n, dtype=float)})


def readable(directory) -> pa.Table:
    return ds.dataset(str(directory), format="parquet").to_table()


CHILD = """
import pathlib, sys, time
import pyarrow.parquet as pq
from dbspec.serving.batch import predict_local
from tests.serving.test_batch_partial import fake_model

written = pq.ParquetWriter.write_batch
def pause_after_first(self, batch, *args, **kwargs):
    written(self, batch, *args, **kwargs)
    pathlib.Path(sys.argv[3]).write_text("mid-write")
    time.sleep(600)
pq.ParquetWriter.write_batch = pause_after_first
predict_local(fake_model(), sys.argv[1], sys.argv[2], fmt="parquet", batch_rows=10)
"""


def test_a_killed_parquet_predict_leaves_the_output_readable_and_a_rerun_cleans_up(tmp_path):
    from dbspec.serving.batch import predict_local

    source, out, marker = tmp_path / "in.parquet", tmp_path / "out", tmp_path / "paused"
    pq.write_table(rows(50), source)
    predict_local(fake_model(), str(source), str(out), fmt="parquet")  # the old predictions
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(source), str(out), str(marker)],
                             env=checkout_env(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert child.poll() is None, child.stderr.read()
            assert time.monotonic() < deadline, "the child never started writing"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    left = sorted(p.name for p in out.iterdir())
    assert len(left) == 2, left  # the old output and the killed write's leftover
    table = readable(out)  # the leftover never makes the directory unreadable
    assert table.num_rows == 50 and table["prediction"].to_pylist() == \
        [1.0 + i for i in range(50)]

    pq.write_table(rows(7), source)
    result = predict_local(fake_model(), str(source), str(out), fmt="parquet")
    assert result.rows == 7
    assert [p.name for p in out.iterdir() if not p.name.endswith(".parquet")] == []
    assert len(list(out.iterdir())) == 1  # the rerun removed the dead write's leftover
    assert readable(out).num_rows == 7


def test_leftovers_of_earlier_kills_are_removed_and_live_writes_kept(tmp_path):
    from dbspec.serving.batch import predict_local

    source, out = tmp_path / "in.parquet", tmp_path / "out"
    pq.write_table(rows(5), source)
    out.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = out / f".part-dbspec-predictions.parquet.{dead.pid}-deadbeef.partial"
    left.write_bytes(b"PAR1")
    live = out / ".part-dbspec-predictions.parquet.1-cafe0123.partial"  # pid 1 never dies
    live.write_bytes(b"PAR1")
    predict_local(fake_model(), str(source), str(out), fmt="parquet")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [live.name, "part-dbspec-predictions.parquet"])
    assert readable(out).num_rows == 5


def test_a_failed_write_keeps_the_previous_output(tmp_path, monkeypatch):
    from dbspec.serving.batch import predict_local

    source, out = tmp_path / "in.parquet", tmp_path / "out"
    pq.write_table(rows(30), source)
    predict_local(fake_model(), str(source), str(out), fmt="parquet")
    written = pq.ParquetWriter.write_batch
    calls = []

    def fail_after_first(self, batch, *args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("disk gone")
        written(self, batch, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_batch", fail_after_first)
    with pytest.raises(RuntimeError, match="disk gone"):
        predict_local(fake_model(), str(source), str(out), fmt="parquet", batch_rows=10)
    assert [p.name for p in out.iterdir()] == ["part-dbspec-predictions.parquet"]
    assert readable(out).num_rows == 30


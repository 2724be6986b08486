"""The inference table keeps every answered request through a SIGKILL, exactly once.

One real ``dbspec serve`` with an inference table pauses its Delta writer right after its first
commit (the ``inference_table.committed`` pause point: committed, its write-ahead segment not yet
deleted), keeps answering, and is SIGKILLed. The next server on the table must commit what the
first one answered after that commit, and must not commit the first segment again.
"""

from __future__ import annotations

import math
import signal
import time

import httpx
import numpy as np
from sklearn.datasets import load_diabetes

from tests.serving.conftest import AUTH, NAME

ROWS = load_diabetes().data[:16].astype(np.float32)


def post_many(server, count: int, first: int) -> dict[str, int]:
    """``count`` answered requests of 1-3 rows; {request id: rows}."""
    answered = {}
    with httpx.Client(headers=AUTH) as client:
        for i in range(first, first + count):
            rows = ROWS[i % 8: i % 8 + 1 + i % 3].tolist()
            response = client.post(server.url + "/invocations", json={"inputs": rows},
                                   headers={"X-Request-ID": f"req-{i}"})
            assert response.status_code == 200, response.text
            answered[response.headers["x-request-id"]] = len(rows)
    return answered


def test_a_sigkilled_server_loses_no_answered_request_and_logs_none_twice(serve, tmp_path,
                                                                         monkeypatch):
    from deltalake import DeltaTable

    table = tmp_path / "inference"
    marker = tmp_path / "paused"
    monkeypatch.setenv("DBSPEC_PAUSE_AT", "inference_table.committed")
    monkeypatch.setenv("DBSPEC_PAUSE_FILE", str(marker))
    first = serve(f"models:/{NAME}/1", "--inference-table", str(table))
    answered = post_many(first, 20, 0)
    deadline = time.monotonic() + 15
    while not marker.exists() and time.monotonic() < deadline:  # the writer committed those
        time.sleep(0.05)  # and stopped before deleting their segment (asserted at the end)
    paused = marker.exists()
    committed = DeltaTable(str(table)).to_pyarrow_table().column("request_id").to_pylist()
    assert set(committed) <= set(answered)
    answered.update(post_many(first, 30, 100))  # logged only in the write-ahead file
    overflow = httpx.post(first.url + "/invocations", headers=AUTH,
                          json={"inputs": [ROWS[0].tolist(), [3e38] * 10]})
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(timeout=30)
    monkeypatch.delenv("DBSPEC_PAUSE_AT")
    before = DeltaTable(str(table)).to_pyarrow_table().num_rows
    assert before < sum(answered.values())  # the kill did leave requests outside the table

    second = serve(f"models:/{NAME}/1", "--inference-table", str(table))
    restart_log = second.output()
    replayed = len(answered) - len(set(committed))
    answered.update(post_many(second, 5, 200))
    assert second.stop(signal.SIGTERM) == 0

    logged = DeltaTable(str(table)).to_pyarrow_table().to_pydict()
    ids = logged["request_id"]
    assert {i: ids.count(i) for i in set(ids)} == answered  # every request, with its rows, once
    assert overflow.status_code == 422, overflow.text
    assert "no finite prediction for row 1 of 2" in overflow.json()["message"]
    assert all(math.isfinite(v) for v in logged["prediction"])
    assert all(math.isfinite(v) for column in ("age", "bmi", "s6") for v in logged[column])
    assert not list((table / ".dbspec-wal").glob("*.wal"))
    assert f"committed {replayed} answered request(s) that a stopped server had logged" \
        in restart_log
    assert paused, "the writer never reached the pause point after its first commit"

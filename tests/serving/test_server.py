"""``dbspec serve`` as a real process on 127.0.0.1, driven over HTTP; the refusals, which never
get as far as serving, and the ``promote`` calls run the CLI in this process."""

from __future__ import annotations

import gzip
import json
import signal
import socket
import threading
import time

import httpx
import numpy as np
import pytest
import requests
from sklearn.datasets import load_diabetes

from tests.conftest import run_in_process
from tests.serving.conftest import AUTH, FEATURES, NAME, TOKEN

ROWS = load_diabetes().data[:64].astype(np.float32)


def expected(registered, version: str, rows) -> list[float]:
    """What the registered version predicts in this process, without the server."""
    import mlflow

    from dbspec.serving.source import ModelTarget, load_version

    client = mlflow.MlflowClient(tracking_uri=registered.tracking_uri)
    loaded = load_version(client, ModelTarget(NAME, version=version), version)
    return loaded.model.predict_frame(np.asarray(rows, dtype=np.float32))["prediction"].tolist()


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_course_client_gets_the_models_predictions(registered, serve):
    server = serve(f"models:/{NAME}/1")
    # the course's client, verbatim: no content type, the token in a header
    response = requests.post(f"{server.url}/invocations",
                             headers={"Authorization": f"Bearer {TOKEN}"},
                             data=json.dumps({"inputs": [ROWS[0].tolist()]}))
    assert response.status_code == 200
    (answer,) = response.json()["predictions"]
    assert answer["prediction"] == pytest.approx(expected(registered, "1", ROWS[:1])[0], rel=1e-5)
    assert response.headers["x-request-id"]


def test_every_scoring_format_gives_the_same_predictions(registered, serve):
    server = serve(f"models:/{NAME}/1")
    rows = ROWS[:5].tolist()
    bodies = [{"inputs": rows}, {"instances": rows},
              {"dataframe_split": {"columns": FEATURES, "data": rows}},
              {"dataframe_records": [dict(zip(FEATURES, r)) for r in rows]},
              {"inputs": {name: [r[j] for r in rows] for j, name in enumerate(FEATURES)}}]
    want = expected(registered, "1", rows)
    with httpx.Client(headers=AUTH) as client:
        for body in bodies:
            response = client.post(server.url + "/invocations", json=body)
            assert response.status_code == 200, response.text
            got = [p["prediction"] for p in response.json()["predictions"]]
            assert got == pytest.approx(want, rel=1e-5)


def test_a_token_is_required_except_for_health_checks(serve):
    server = serve(f"models:/{NAME}/1")
    body = {"inputs": [ROWS[0].tolist()]}
    with httpx.Client() as client:
        missing = client.post(server.url + "/invocations", json=body)
        wrong = client.post(server.url + "/invocations", json=body,
                            headers={"Authorization": "Bearer nope"})
        basic = client.post(server.url + "/invocations", json=body,
                            headers={"Authorization": f"Basic {TOKEN}"})
        for refused in (missing, wrong, basic):
            assert refused.status_code == 401
            assert refused.json()["error_code"] == "UNAUTHENTICATED"
            assert refused.headers["www-authenticate"].startswith("Bearer")
        assert client.get(server.url + "/version").status_code == 401
        assert client.get(server.url + "/metrics").status_code == 401
        assert client.get(server.url + "/ping").status_code == 200
        health = client.get(server.url + "/health").json()
        assert health == {"status": "ok", "model_name": NAME, "model_version": "1"}
        version = client.get(server.url + "/version", headers=AUTH).json()
        assert version["model_uri"] == f"models:/{NAME}/1"


BAD = [
    (400, {"content": b'{"inputs": [[1, 2]]}'}, "the model takes 10"),
    (400, {"json": {"inputs": [["x"] * 10]}}, "must be a number"),
    (400, {"content": b'{"inputs": [[NaN, 1, 1, 1, 1, 1, 1, 1, 1, 1]]}'}, "NaN"),
    (400, {"json": {"inputs": []}}, "empty"),
    (400, {"content": b'{"inputs": [[1, 2'}, "malformed JSON"),
    (400, {"content": b""}, "empty request body"),
    (400, {"json": {"dataframe_records": [{"age": 1}]}}, "missing column sex"),
    (415, {"content": b"1,2,3", "headers": {"Content-Type": "text/csv"}}, "content type"),
    (413, {"content": b"x" * 3000}, "3000 bytes is over the 2000-byte limit"),
    # issue 34: a repeated column was scored with its first values, the second ignored
    (400, {"json": {"dataframe_split": {"columns": FEATURES + ["bmi"],
                                        "data": [[0.01] * 10 + [5.0]]}}},
     "dataframe_split: column 'bmi' appears twice in 'columns' (at 2 and 10): send it once"),
    # issue 34: a gzip body was answered "malformed JSON ... byte 0x8b"
    (415, {"content": gzip.compress(b'{"inputs": [[0,0,0,0,0,0,0,0,0,0]]}'),
           "headers": {"Content-Encoding": "gzip"}},
     "unsupported Content-Encoding 'gzip': send the body uncompressed"),
]


def test_bad_requests_get_a_4xx_with_a_message_and_the_server_keeps_serving(registered, serve):
    server = serve(f"models:/{NAME}/1", "--max-body-bytes", "2000")
    with httpx.Client(headers=AUTH) as client:
        for status, request, message in BAD:
            headers = {**AUTH, **request.pop("headers", {})}
            response = client.post(server.url + "/invocations", headers=headers, **request)
            assert response.status_code == status, (request, response.text)
            assert message in response.json()["message"]
        assert client.get(server.url + "/invocations").status_code == 405
        assert client.get(server.url + "/nowhere").status_code == 404
        good = client.post(server.url + "/invocations", json={"inputs": [ROWS[0].tolist()]})
        assert good.status_code == 200
    # a chunked body (no content-length) that grows past the limit is cut off at the limit
    with httpx.Client(headers=AUTH) as client:
        chunks = (b'{"inputs": [' + b"[0,0,0,0,0,0,0,0,0,0]," * 50 for _ in range(10))
        try:
            status = client.post(server.url + "/invocations", content=chunks).status_code
        except httpx.TransportError:  # the server may close before the client finished
            status = 413
        assert status == 413
    assert metric(server, 'dbspec_requests_total{path="/invocations",status="500"}') == 0
    assert httpx.post(server.url + "/invocations", headers=AUTH,
                      json={"inputs": [ROWS[1].tolist()]}).status_code == 200


def test_concurrent_requests_are_merged_into_batches(registered, serve):
    import asyncio

    server = serve(f"models:/{NAME}/1", "--max-wait-ms", "50", "--max-batch-size", "32")
    want = expected(registered, "1", ROWS[:48])

    async def burst():
        async with httpx.AsyncClient(headers=AUTH, limits=httpx.Limits(max_connections=48)) \
                as client:
            return await asyncio.gather(*[
                client.post(server.url + "/invocations", json={"inputs": [ROWS[i].tolist()]})
                for i in range(48)])

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 48
    got = [r.json()["predictions"][0]["prediction"] for r in responses]
    assert got == pytest.approx(want, rel=1e-5)  # each request gets its own rows back
    batches = metric(server, "dbspec_batch_requests_count")
    assert metric(server, "dbspec_batch_requests_sum") == 48
    assert batches < 48  # some requests shared a forward pass
    assert metric(server, "dbspec_batch_rows_sum") == 48


def test_watch_alias_swaps_versions_without_dropping_requests(registered, serve):
    store = ["--tracking-uri", registered.tracking_uri]
    cwd = registered.workdir
    assert run_in_process("promote", NAME, "1", "--alias", "live", "--force", *store,
                          cwd=cwd).returncode == 0
    server = serve(f"models:/{NAME}@live", "--watch-alias", "--watch-interval", "0.3")
    statuses, stop = [], threading.Event()

    def load():
        with httpx.Client(headers=AUTH) as client:
            while not stop.is_set():
                statuses.append(client.post(server.url + "/invocations",
                                            json={"inputs": [ROWS[0].tolist()]}).status_code)

    workers = [threading.Thread(target=load) for _ in range(4)]
    for worker in workers:
        worker.start()
    try:
        assert run_in_process("promote", NAME, "2", "--alias", "live", "--force", *store,
                              cwd=cwd).returncode == 0
        deadline = time.monotonic() + 30
        while httpx.get(server.url + "/version", headers=AUTH).json()["model_version"] != "2":
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.2)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert statuses and set(statuses) == {200}
    answer = httpx.post(server.url + "/invocations", headers=AUTH,
                        json={"inputs": [ROWS[0].tolist()]}).json()["predictions"][0]
    assert answer["prediction"] == pytest.approx(expected(registered, "2", ROWS[:1])[0], rel=1e-5)
    assert expected(registered, "1", ROWS[:1]) != pytest.approx(expected(registered, "2",
                                                                         ROWS[:1]), rel=1e-5)
    assert metric(server, "dbspec_model_swaps_total") == 1
    assert f"models:/{NAME}@live moved: now serving v2 (was v1)" in server.output()


def test_the_inference_table_holds_every_answered_request_after_a_graceful_stop(registered,
                                                                               serve, tmp_path):
    from deltalake import DeltaTable

    table = tmp_path / "inference"
    server = serve(f"models:/{NAME}/1", "--inference-table", str(table))
    ids, rows = [], 0
    with httpx.Client(headers=AUTH) as client:
        for i in range(30):
            batch = ROWS[i % 8: i % 8 + 1 + i % 3].tolist()
            response = client.post(server.url + "/invocations", json={"inputs": batch})
            assert response.status_code == 200
            ids.append(response.headers["x-request-id"])
            rows += len(batch)
        given = client.post(server.url + "/invocations", json={"inputs": [ROWS[0].tolist()]},
                            headers={"X-Request-ID": "client-chosen-id"})
        assert given.headers["x-request-id"] == "client-chosen-id"
        ids.append("client-chosen-id")
        rows += 1
    assert server.stop(signal.SIGTERM) == 0
    assert "stopped" in server.output()
    logged = DeltaTable(str(table)).to_pyarrow_table().to_pydict()
    assert sorted(set(logged["request_id"])) == sorted(ids)
    assert len(logged["request_id"]) == rows
    assert set(logged["model_name"]) == {NAME} and set(logged["model_version"]) == {"1"}
    assert set(FEATURES) <= set(logged) and "prediction" in logged and "latency_ms" in logged
    first = logged["request_id"].index("client-chosen-id")
    assert logged["age"][first] == pytest.approx(float(ROWS[0][0]))
    assert logged["prediction"][first] == pytest.approx(expected(registered, "1", ROWS[:1])[0],
                                                        rel=1e-5)


def test_a_public_address_needs_a_token_or_an_explicit_no_auth(registered):
    env = {"MLFLOW_TRACKING_URI": registered.tracking_uri, "DBSPEC_TOKEN": ""}
    result = run_in_process("serve", f"models:/{NAME}/1", "--host", "0.0.0.0",
                            cwd=registered.workdir, env=env)
    assert result.returncode == 2
    assert "refusing to serve on 0.0.0.0 without authentication" in result.stderr
    assert "--no-auth" in result.stderr and "Traceback" not in result.stderr


def test_a_busy_port_is_a_clear_error(registered):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_in_process("serve", f"models:/{NAME}/1", "--port", str(port),
                                cwd=registered.workdir,
                                env={"MLFLOW_TRACKING_URI": registered.tracking_uri})
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


@pytest.mark.parametrize("args, code, message", [
    (["models:/no_such_model/1"], 1, "registered model 'no_such_model' does not exist"),
    ([f"models:/{NAME}/99"], 1, f"'{NAME}' has no version 99"),
    ([f"models:/{NAME}@nobody"], 1, "no version of 'diabetes_predictor_smoke' holds the alias "
                                    "'nobody'"),
    (["models:/a/b/c"], 2, "expected models:/NAME@ALIAS"),
    ([f"models:/{NAME}/1", "--port", "-3"], 2, "--port must be 0 or more"),
    ([f"models:/{NAME}/1", "--max-batch-size", "0"], 2, "--max-batch-size must be at least 1"),
    ([f"models:/{NAME}/1", "--watch-alias"], 2, "--watch-alias needs a model chosen by alias"),
    ([f"models:/{NAME}/1", "--target", "prod"], 2, "apply to a spec, not to a models:/ URI"),
    ([f"models:/{NAME}/1", "--port", "99999"], 2, "--port must be 0 to 65535"),
    ([f"models:/{NAME}@live", "--watch-alias", "--watch-interval", "nan"], 2,
     "--watch-interval must be positive"),
    ([f"models:/{NAME}/1", "--inference-table", "/proc/dbspec/table"], 1,
     "inference table /proc/dbspec/table: cannot write there"),
])
def test_bad_serve_arguments_are_clear_errors(registered, args, code, message):
    result = run_in_process("serve", *args, cwd=registered.workdir,
                            env={"MLFLOW_TRACKING_URI": registered.tracking_uri})
    assert result.returncode == code, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_spec_serves_its_registered_model_and_alias(registered, serve):
    from tests.conftest import ROOT

    spec = str(ROOT / "specs" / "diabetes.yaml")
    result = run_in_process("serve", spec, "--set", f"registry.name={NAME}", "--alias", "nobody",
                            cwd=registered.workdir,
                            env={"MLFLOW_TRACKING_URI": registered.tracking_uri})
    assert result.returncode == 1 and "holds the alias 'nobody'" in result.stderr
    # an alias of this test's own (it used to serve @live, which only the watch-alias test
    # sets: alone, this test failed)
    assert run_in_process("promote", NAME, "1", "--alias", "spec_served", "--force",
                          "--tracking-uri", registered.tracking_uri,
                          cwd=registered.workdir).returncode == 0
    server = serve(spec, "--set", f"registry.name={NAME}", "--alias", "spec_served")
    version = httpx.get(server.url + "/version", headers=AUTH).json()
    assert version["model_uri"] == f"models:/{NAME}@spec_served"


def test_an_inference_table_path_holding_another_delta_table_is_refused(registered, tmp_path):
    from deltalake import write_deltalake

    import pyarrow as pa

    write_deltalake(str(tmp_path / "other"), pa.table({"x": [1, 2]}))
    result = run_in_process("serve", f"models:/{NAME}/1", "--inference-table",
                            str(tmp_path / "other"), cwd=registered.workdir,
                            env={"MLFLOW_TRACKING_URI": registered.tracking_uri})
    assert result.returncode == 1 and "is a Delta table of another kind" in result.stderr


def test_inference_table_columns_never_overwrite_each_other(tmp_path):
    from dbspec.serving.inference_table import InferenceTable, Record

    table = InferenceTable(tmp_path / "t")
    record = Record("r1", 1.0, "m", "1", 2.5, ("timestamp", "x"),
                    np.array([[7.0, 8.0]], dtype=np.float32), {"prediction": np.array([0.5])})
    written = table._table([record]).to_pydict()
    assert written["request_id"] == ["r1"] and written["latency_ms"] == [2.5]
    assert written["feature_timestamp"] == [7.0] and written["feature_x"] == [8.0]

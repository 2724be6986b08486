"""The documented whole loop on the diabetes spec (docs/operations/monitoring.md), command for
command: train, approval refused to
an analyst and given by an admin, a real ``dbspec serve`` capturing real HTTP traffic in its
Delta inference table, ``dbspec monitor`` quiet on unshifted rows, a data scientist's retrain
promoted through @staging and approved, shifted traffic, ``monitor`` exiting 3 and rolling
@production back (the server follows), ``models`` showing the lifecycle. Against the session's
real ``mlflow server --app-name basic-auth`` (tests/access/conftest.py).

The commands are read from that page's block between ``<!-- loop:start -->`` and
``<!-- loop:end -->``, so the page says what this test runs; the test checks the list first,
then runs it with the server's address for the page's 127.0.0.1:5000 and a port of the
server's choosing for 8080. A ``# traffic`` line sends 60 requests of 8 diabetes rows over
HTTP (the page shows one as ``curl``, which is not run).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import time
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from tests.access.conftest import as_user
from tests.conftest import ROOT, run_in_process
from tests.serving.conftest import AUTH, FEATURES, TOKEN, start_server

NAME = "diabetes_predictor"
EXPECTED = [
    ("env", "MLFLOW_TRACKING_URI=http://127.0.0.1:5000 DBSPEC_TOKEN=change-me"),
    ("carol@example.com", "run specs/diabetes.yaml --set roles.admin=[user:carol@example.com] "
                          "--set roles.data_scientist=[user:bob@example.com] "
                          "--set roles.analyst=[user:alice@example.com]"),
    ("alice@example.com", f"approve {NAME} 1 --alias production"),
    ("carol@example.com", f"approve {NAME} 1 --alias production"),
    ("carol@example.com", "serve specs/diabetes.yaml --watch-alias &"),
    ("traffic", "rows like the training data"),
    ("carol@example.com", "monitor specs/diabetes.yaml"),
    ("bob@example.com", "run specs/diabetes.yaml --set vars.hidden=64"),
    ("carol@example.com", f"approve {NAME} 2 --alias production"),
    ("traffic", "bmi shifted by five standard deviations"),
    ("carol@example.com", "monitor specs/diabetes.yaml"),
    ("carol@example.com", f"models {NAME}"),
]


def documented_loop() -> list[tuple[str, str]]:
    """(user or ``traffic`` or ``env``, command or description) for each step of the
    documented loop block, in order."""
    text = (ROOT / "docs" / "operations" / "monitoring.md").read_text()
    block = text.split("<!-- loop:start -->")[1].split("<!-- loop:end -->")[0]
    steps, user = [], None
    for line in block.splitlines():
        if line.startswith("# as "):
            user = line[len("# as "):].split(":")[0].strip()
        elif line.startswith("# traffic: "):
            steps.append(("traffic", line[len("# traffic: "):].strip()))
        elif line.startswith("$ export "):
            steps.append(("env", line[len("$ export "):].strip()))
        elif line.startswith("$ dbspec "):
            steps.append((user, line[len("$ dbspec "):].strip()))
    return steps


def test_the_documented_loop_is_the_one_this_test_runs():
    assert documented_loop() == EXPECTED


def _traffic(url: str, *, shift: float) -> int:
    from sklearn.datasets import load_diabetes

    rows = load_diabetes().data
    rng = np.random.default_rng(11 if shift else 5)
    sent = 0
    for _ in range(60):
        batch = rows[rng.integers(0, len(rows), 8)].copy()
        batch[:, FEATURES.index("bmi")] += shift * rows[:, FEATURES.index("bmi")].std()
        answer = httpx.post(url + "/invocations", headers=AUTH, timeout=30,
                            json={"dataframe_split": {"columns": FEATURES,
                                                      "data": batch.tolist()}})
        assert answer.status_code == 200, answer.text
        sent += len(batch)
    return sent


def _served_version(url: str, want: str, timeout: float = 60) -> str:
    """The version the endpoint serves, once it is ``want`` or ``timeout`` ran out (the alias
    watcher polls the registry every 10 s)."""
    deadline = time.monotonic() + timeout
    while True:
        served = str(httpx.get(url + "/health", timeout=10).json()["model_version"])
        if served == want or time.monotonic() > deadline:
            return served
        time.sleep(0.5)


@pytest.mark.slow
def test_the_module4_loop_runs_from_the_docs(auth_server, tmp_path):
    from mlflow import MlflowClient

    work = tmp_path / "loop"
    (work / "specs").mkdir(parents=True)
    shutil.copy(ROOT / "specs" / "diabetes.yaml", work / "specs" / "diabetes.yaml")
    steps = documented_loop()
    assert steps == EXPECTED
    server, results, shifted = None, [], False
    try:
        for user, step in steps[1:]:
            if user == "traffic":
                shifted = "shifted" in step
                # the endpoint follows @production within its watch interval: traffic goes to
                # the version that holds it (as the page says, after the swap)
                with as_user(auth_server, "carol@example.com"):
                    holder = str(MlflowClient(auth_server.uri).get_model_version_by_alias(
                        NAME, "production").version)
                assert _served_version(server.url, holder) == holder, server.output()
                _traffic(server.url, shift=5.0 if shifted else 0.0)
                time.sleep(1.5)  # the inference table commits at least once a second
                continue
            env = {**auth_server.env(user), "DBSPEC_TOKEN": TOKEN}
            args = shlex.split(step)
            if args[-1] == "&":  # the endpoint, in the background
                server = start_server(SimpleNamespace(tracking_uri=auth_server.uri,
                                                      workdir=work),
                                      *args[1:-1], log=tmp_path / "serve.log", env=env)
                continue
            result = run_in_process(*args, cwd=work, env=env, timeout=600)
            results.append((user, step, result))
        # after the rollback the endpoint, watching @production, serves v1 again
        served = _served_version(server.url, "1") if results[-2][2].returncode == 3 else None
    finally:
        stopped = server.stop() if server is not None else 0
    codes = [r.returncode for _, _, r in results]
    outputs = "\n\n".join(f"$ {s} ({u}) -> {r.returncode}\n{r.stdout}\n{r.stderr}"
                          for u, s, r in results)
    assert codes == [0, 1, 0, 0, 0, 0, 3, 0], outputs
    assert stopped == 0, server.output()
    (_, _, refused) = results[1]
    assert "alice@example.com may not" in refused.stderr and "Traceback" not in refused.stderr
    (_, _, quiet), (_, _, alert) = results[3], results[6]
    assert "alert" not in quiet.stderr.lower(), quiet.stdout + quiet.stderr
    assert re.search(r"alert: diabetes_predictor v2: drift in .*bmi", alert.stderr), alert.stderr
    assert f"rolled back {NAME}@production: v2 -> v1" in alert.stdout
    with as_user(auth_server, "carol@example.com"):
        client = MlflowClient(auth_server.uri)
        assert str(client.get_model_version_by_alias(NAME, "production").version) == "1"
        assert str(client.get_model_version_by_alias(NAME, "staging").version) == "2"
        v1, v2 = (client.get_model_version(NAME, v).tags for v in ("1", "2"))
    # archived when v2 was approved, restored by the rollback
    assert json.loads(v1["dbspec.lifecycle"])["state"] == "restored"
    assert json.loads(v2["dbspec.lifecycle"])["state"] == "archived"
    assert "bmi" in v1["dbspec.monitoring.restored"] and "v1" in v2["dbspec.monitoring.rolled_back"]
    assert "carol@example.com" in v2["dbspec.approval.production"]
    models = results[7][2].stdout
    assert re.search(r"v1 .*production", models, re.IGNORECASE), models
    assert served == "1", server.output()

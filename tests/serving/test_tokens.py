"""Serving tokens per role: a scoring token scores, an admin token reads everything too.

Real ``dbspec serve`` processes on 127.0.0.1, driven over HTTP.
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import ROOT, run_in_process, run_main
from tests.serving.conftest import NAME, TOKEN

SPEC = str(ROOT / "specs" / "diabetes.yaml")
SCORING, ADMIN = "scoring-only-4b1e", "admin-token-9c2d"
ROLES = ["--set", "serving.realtime.auth.tokens.scoring=SCORE_TOKEN",
         "--set", "serving.realtime.auth.tokens.admin=OPS_TOKEN"]
BODY = {"inputs": [[0.03, 0.05, 0.06, 0.02, -0.04, -0.03, -0.04, -0.002, 0.02, -0.02]]}


def _promoted(registered) -> None:
    """Version 1 holds @tokens_served (each test sets it: tests run alone and in any order)."""
    assert run_in_process("promote", NAME, "1", "--alias", "tokens_served", "--force",
                          "--tracking-uri", registered.tracking_uri,
                          cwd=registered.workdir).returncode == 0


def _served(registered, serve, **env):
    _promoted(registered)
    return serve(SPEC, "--set", f"registry.name={NAME}", "--alias", "tokens_served", *ROLES,
                 env={"SCORE_TOKEN": SCORING, "OPS_TOKEN": ADMIN, **env})


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_scoring_token_scores_and_reads_nothing_else(registered, serve):
    server = _served(registered, serve)
    assert "scoring token from $SCORE_TOKEN" in server.output()
    with httpx.Client(headers=_as(SCORING)) as client:
        assert client.post(server.url + "/invocations", json=BODY).status_code == 200
        for route in ("/metrics", "/version"):
            refused = client.get(server.url + route)
            assert refused.status_code == 403, refused.text
            assert refused.json()["error_code"] == "PERMISSION_DENIED"
            assert f"{route} needs the admin token" in refused.json()["message"]
        assert client.get(server.url + "/health").status_code == 200  # no token needed


@pytest.mark.parametrize("token", [ADMIN, TOKEN])  # the admin role, and token_env's token
def test_an_admin_token_reads_everything(registered, serve, token):
    server = _served(registered, serve)
    with httpx.Client(headers=_as(token)) as client:
        assert client.post(server.url + "/invocations", json=BODY).status_code == 200
        assert client.get(server.url + "/metrics").status_code == 200
        assert client.get(server.url + "/version").json()["model_name"] == NAME


def test_an_unknown_token_is_refused(registered, serve):
    server = _served(registered, serve)
    refused = httpx.post(server.url + "/invocations", json=BODY, headers=_as("nope"))
    assert refused.status_code == 401
    assert refused.json()["error_code"] == "UNAUTHENTICATED"


def test_a_role_token_whose_variable_is_unset_is_refused_at_start(registered, monkeypatch):
    monkeypatch.delenv("SCORE_TOKEN", raising=False)
    _promoted(registered)  # so that the missing variable, not the alias, is what stops it
    result = run_in_process("serve", SPEC, "--set", f"registry.name={NAME}", "--alias",
                            "tokens_served", *ROLES, cwd=registered.workdir,
                            env={"MLFLOW_TRACKING_URI": registered.tracking_uri,
                                 "OPS_TOKEN": ADMIN})
    assert result.returncode != 0
    assert "serving.realtime.auth.tokens.scoring names $SCORE_TOKEN, which is not set" \
        in result.stderr, result.stderr


def test_token_roles_are_checked_in_the_spec():
    code, out, _ = run_main("validate", SPEC, "--set", "serving.realtime.auth.tokens.reader=X")
    assert code == 1
    assert "serving.realtime.auth.tokens.reader: unknown value 'reader'; expected 'scoring' or " \
        "'admin'" in out, out
    # on a public address, role tokens alone are authentication enough
    code, out, _ = run_main("validate", SPEC, "--set", "serving.realtime.host=0.0.0.0",
                            "--set", "serving.realtime.auth.token_env=null",
                            "--set", "serving.realtime.auth.tokens.scoring=SCORE_TOKEN")
    assert code == 0, out
    code, out, _ = run_main("validate", SPEC, "--set", "serving.realtime.host=0.0.0.0",
                            "--set", "serving.realtime.auth.token_env=null")
    assert code == 1 and "without a token would expose the model" in out, out

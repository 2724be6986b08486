"""``dbspec models``, ``promote`` and ``rollback`` from the command line, on a real MLflow
registry (SQLite in the test's own directory)."""

from __future__ import annotations

from tests.conftest import ROOT
from tests.conftest import run_main as run

SPECS = ROOT / "specs"


def test_rollback_steps_back_through_history(workdir):
    spec = str(SPECS / "diabetes.yaml")
    for _ in range(3):  # three versions, each promoted by hand below
        assert run("run", spec, "--smoke", "-q", "--from", "train")[0] == 0
    name = "diabetes_predictor_smoke"
    for version in ("1", "2", "3"):
        assert run("promote", name, version, "--alias", "prod", "--force")[0] == 0
    steps = []
    for _ in range(2):
        code, out, _ = run("rollback", name, "--alias", "prod")
        assert code == 0
        steps.append(out.split("-> v")[1].split()[0])
    assert steps == ["2", "1"]
    code, out, _ = run("promote", name, "1", "--alias", "prod", "--force")
    assert code == 0 and out.strip() == f"{name}@prod holds v1 already: nothing moved"


def test_bad_alias_is_a_clear_error(workdir):
    # refused before any store is opened (MLflow itself would only say it cannot set @v3)
    code, _, err = run("promote", "diabetes_predictor_smoke", "1", "--alias", "v3", "--force")
    assert code == 1 and "'v3' is reserved by the MLflow registry" in err
    assert "Traceback" not in err


def test_registry_commands_without_a_store_say_what_to_do(workdir):
    code, _, err = run("models", "anything")
    assert code == 1 and "no tracking store at" in err and "run a spec first" in err

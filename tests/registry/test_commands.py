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


def _registry_with_versions(tmp_path, name: str, versions: int):
    """A real SQLite registry with ``versions`` bare versions of ``name``; its CLI options."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri, uri)
    client.create_registered_model(name)
    for _ in range(versions):
        client.create_model_version(name, source=str(tmp_path))
    return client, ["--tracking-uri", uri, "--state-dir", str(tmp_path)]


def test_rollback_moves_only_while_the_expected_version_holds_the_alias(workdir):
    """The deployment job's rollback task: the monitor saw v2 alert; a version promoted since
    (here: none, then v3) must stay."""
    client, store = _registry_with_versions(workdir, "m", 3)
    for version in ("1", "2"):
        assert run("promote", "m", version, "--alias", "prod", "--force", *store)[0] == 0
    code, out, _ = run("rollback", "m", "--alias", "prod", "--to", "1", "--expected", "3", *store)
    assert code == 0 and out.strip() == "m@prod holds v2, not v3: left as it is"
    assert str(client.get_model_version_by_alias("m", "prod").version) == "2"
    code, out, _ = run("rollback", "m", "--alias", "prod", "--to", "1", "--expected", "2", *store)
    assert code == 0 and out.strip() == "m@prod -> v1 (rolled back from v2)"
    assert str(client.get_model_version_by_alias("m", "prod").version) == "1"


def test_link_job_sets_the_deployment_job_of_an_existing_or_new_model(workdir):
    """``dbspec link-job`` on a real (SQLite) store: it updates the model, or creates it when
    missing (the store keeps no deployment_job_id: only Unity Catalog's does)."""
    client, store = _registry_with_versions(workdir, "main.ml.linked", 0)
    code, out, err = run("link-job", "main.ml.linked", "42", *store)
    assert code == 0 and out.strip() == "main.ml.linked: deployment job 42", err
    code, out, err = run("link-job", "main.ml.new", "43", *store)
    assert code == 0 and out.strip() == "main.ml.new: deployment job 43", err
    assert client.get_registered_model("main.ml.new").name == "main.ml.new"
    code, _, err = run("link-job", "main.ml.linked", "42", "--tracking-uri",
                       "http://127.0.0.1:9")
    assert code == 1 and "does not answer" in err and "Traceback" not in err

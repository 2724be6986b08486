"""A registry that answers errors is never read as "no holder" (issue 16): the one alias
lookup (:func:`dbspec.registry.alias_holder`) returns None only when the registry confirms that
nothing holds the alias, so a ``better_than`` gate fails and an alias does not move."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tests.registry.conftest import NAME

ALIAS_LOOKUP = ("GET", "/api/2.0/mlflow/registered-models/alias")
SPEC = """\
name: fail_closed
data: {{source: {{kind: sklearn, name: diabetes}}, task: regression}}
model:
  layers:
    - linear: {{out: 1}}
registry:
  name: {name}
  promotion:
    alias: production
    gates:
      - {{metric: test_rmse, better_than: production}}
"""


def test_the_holder_is_none_only_when_the_registry_says_so(store, tmp_path):
    """With MLflow's client and with serving's registry (which reads through one) alike."""
    from dbspec.registry import alias_holder
    from dbspec.serving.source import open_client

    uri, client, _ = store
    reader = open_client(uri, tmp_path)
    for registry in (client, reader):
        assert alias_holder(registry, NAME, "production") is None  # SQL: INVALID_PARAMETER
        assert alias_holder(registry, "no_such_model", "production") is None
    version = client.create_model_version(NAME, str(tmp_path / "model")).version
    client.set_registered_model_alias(NAME, "production", version)
    for registry in (client, reader):
        assert str(alias_holder(registry, NAME, "production").version) == str(version)


def test_a_registry_answering_errors_is_an_error_not_no_holder(erroring_registry):
    import mlflow

    from dbspec.registry import Registry, RegistryError, RegistryUnavailable, alias_holder
    from dbspec.serving.source import ModelTarget, resolve_version

    client = mlflow.MlflowClient(erroring_registry)
    with pytest.raises(RegistryUnavailable, match=r"did not answer \(@production of 'm'\).*503"):
        alias_holder(client, "m", "production")
    with pytest.raises(RegistryUnavailable, match="did not answer"):
        Registry(client).holder("m", "production")
    with pytest.raises(RegistryUnavailable, match="registered model 'm'"):
        Registry(client).snapshot("m")  # not "no registered model 'm'"
    # serving reads the alias through the same lookup; the endpoint tells a failure by this
    with pytest.raises(RegistryError, match="^the registry did not answer"):
        resolve_version(client, ModelTarget("m", alias="production"))


def test_a_better_than_gate_fails_with_the_registry_error(erroring_registry):
    import mlflow

    from dbspec.registry import Registry
    from dbspec.registry.gating import evaluate_gates
    from dbspec.seams.gates import Champion, GateInputs
    from dbspec.spec.sections.lifecycle import Gate

    registry = Registry(mlflow.MlflowClient(erroring_registry))

    def champion(alias: str, metric: str) -> Champion:
        holder = registry.holder("m", alias)
        return Champion(None if holder is None else str(holder.version), 1.0)

    [result] = evaluate_gates([Gate(metric="test_rmse", better_than="production")],
                              GateInputs({"test_rmse": 50.0}, champion=champion))
    assert not result.passed
    assert "cannot compare with @production: the registry did not answer" in result.note
    assert "no version holds" not in result.describe()


def _first_version(client, name: str) -> str:
    client.create_registered_model(name)
    run = client.create_run("0").info.run_id
    return str(client.create_model_version(name, f"runs:/{run}/model", run_id=run).version)


def _unset(client, name: str, alias: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return True
    return False


def test_promote_does_not_move_an_alias_it_cannot_read(flaky_proxy, mlflow_server):
    """``dbspec promote`` through a server whose alias lookups answer 503: the registered
    model reads fine and shows no holder, but the holder cannot be confirmed before the move,
    so the alias stays unset (the lookup that failed open let it move)."""
    import mlflow

    from dbspec.registry import GATES_TAG, Registry, RegistryUnavailable
    from dbspec.registry.promotion import promote

    real = mlflow.MlflowClient(mlflow_server.uri)
    name = f"fail_closed_cmd_{time.time_ns()}"
    version = _first_version(real, name)
    real.set_model_version_tag(name, version, GATES_TAG,
                               '[{"metric": "test_rmse", "better_than": "production"}]')
    real.set_model_version_tag(name, version, "metric.test_rmse", "50")
    flaky_proxy.failing.append(ALIAS_LOOKUP)
    registry = Registry(mlflow.MlflowClient(flaky_proxy.uri))
    with pytest.raises(RegistryUnavailable, match="did not answer"):
        promote(registry, name, version, "production", force=False)
    assert flaky_proxy.failed  # the lookup was made, and answered with an error
    assert _unset(real, name, "production")
    registry.lock_wait_s = 0.0
    with registry.lock(name):  # the lock was released on the error: taken again at once
        pass


def test_the_promote_stage_fails_closed(flaky_proxy, mlflow_server, tmp_path):
    """The promote stage of a run, its registry's alias lookups answering 503: the stage fails
    with the registry's error and the alias does not move."""
    import mlflow

    from dbspec.registry import RegistryUnavailable
    from dbspec.spec.loader import load_spec
    from dbspec.stages.base import Reporter, RunOptions, StageContext
    from dbspec.stages.lifecycle import PromoteStage
    from dbspec.stages.outputs import EvaluateOutput, RegisterOutput, TrainOutput

    real = mlflow.MlflowClient(mlflow_server.uri)
    name = f"fail_closed_stage_{time.time_ns()}"
    version = _first_version(real, name)
    (tmp_path / "s.yaml").write_text(SPEC.format(name=name))
    flaky_proxy.failing.append(ALIAS_LOOKUP)
    ctx = StageContext(
        loaded=load_spec(str(tmp_path / "s.yaml")), directory=tmp_path, project_dir=tmp_path,
        upstream={"register": RegisterOutput(name, version).to_json(),
                  "evaluate": EvaluateOutput({"test_rmse": 50.0}).to_json(),
                  "train": TrainOutput("r1", "0", mlflow_server.uri, "models:/m-1", None,
                                       False, "cpu", 1, 9, 1, 1, 100.0).to_json()},
        upstream_dirs={}, options=RunOptions(), reporter=Reporter(enabled=False),
        _tracker=SimpleNamespace(client=mlflow.MlflowClient(flaky_proxy.uri)))
    with pytest.raises(RegistryUnavailable, match="did not answer"):
        PromoteStage().run(ctx)
    assert _unset(real, name, "production")

"""Registry reads that fail are never taken for an answer: a run that cannot be read keeps
its pending version, and a model that cannot be read is not "nothing holds the alias".
(The failing registry is a stand-in object: the errors are MLflow's own exception type with
the codes a server answers with; the real-server cases are in test_fail_closed.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mlflow.exceptions import MlflowException


class _Failing:
    def __init__(self, code: str):
        self.code = code

    def _raise(self, *_args, **_kwargs):
        from mlflow.protos import databricks_pb2

        raise MlflowException("the store failed", error_code=getattr(databricks_pb2, self.code))

    get_run = get_registered_model = _raise


def _pending(run_id="r1"):
    return SimpleNamespace(run_id=run_id, version="3", tags={}, creation_timestamp=0)


@pytest.mark.parametrize("code, dead", [("INTERNAL_ERROR", False), ("PERMISSION_DENIED", False),
                                        ("RESOURCE_DOES_NOT_EXIST", True)])
def test_a_pending_versions_run_is_dead_only_when_it_is_gone(code, dead):
    from dbspec.registry.pending import owner_is_dead

    assert owner_is_dead(_Failing(code), _pending()) is dead


def test_an_unreadable_model_is_not_an_unset_alias():
    from dbspec.registry.errors import RegistryUnavailable
    from dbspec.serving.source import ModelTarget, _no_holder

    target = ModelTarget("m", alias="production")
    with pytest.raises(RegistryUnavailable, match="the registry did not answer"):
        _no_holder(_Failing("INTERNAL_ERROR"), target)
    assert "does not exist" in _no_holder(_Failing("RESOURCE_DOES_NOT_EXIST"), target)


def test_a_connection_that_fails_is_a_registry_failure_on_the_serving_path_too():
    # the serving path used its own copy of the "is this the registry's answer" test, which
    # let an OSError through as a traceback
    from dbspec.registry.errors import RegistryUnavailable
    from dbspec.serving.source import ModelTarget, _no_holder

    class Unreachable:
        def get_registered_model(self, name):
            raise ConnectionRefusedError("connection refused")

    with pytest.raises(RegistryUnavailable, match="connection refused"):
        _no_holder(Unreachable(), ModelTarget("m", alias="production"))

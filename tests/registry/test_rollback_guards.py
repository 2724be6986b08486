"""What a rollback may not do: deploy a version that never held the last stage's alias (a new
version goes through promote and approve), or move an alias off a version other than the one
it was asked to roll back (``dbspec monitor``'s rollback, decided under the lock)."""

from __future__ import annotations

import json

import pytest

from tests.registry.conftest import NAME


def _versions(client, tmp_path, count: int) -> list[str]:
    return [str(client.create_model_version(NAME, str(tmp_path / "model")).version)
            for _ in range(count)]


def _staged(client) -> None:
    client.set_registered_model_tag(NAME, "dbspec.promotion_stages",
                                    json.dumps(["staging", "production"]))


def test_rollback_to_a_version_that_never_held_the_last_stage_is_refused(store, tmp_path):
    from dbspec.registry import RegistryError
    from dbspec.registry.commands import rollback

    _, client, registry = store
    _staged(client)
    v1, v2, v3 = _versions(client, tmp_path, 3)
    registry.move_alias(NAME, "production", v1, reason="approved")
    registry.move_alias(NAME, "production", v2, reason="approved")
    with pytest.raises(RegistryError, match=f"v{v3} of {NAME} never held @production"):
        rollback(registry, NAME, "production", v3)
    assert str(client.get_model_version_by_alias(NAME, "production").version) == v2
    assert rollback(registry, NAME, "production", v1)["version"] == v1  # it was deployed
    # an earlier stage's alias is not a deployment: --to any version stays allowed there
    registry.move_alias(NAME, "staging", v1, reason="gates passed")
    assert rollback(registry, NAME, "staging", v3)["version"] == v3


def test_a_rollback_expecting_another_holder_moves_nothing(store, tmp_path):
    from dbspec.registry.commands import rollback

    _, client, registry = store
    v1, v2, v3 = _versions(client, tmp_path, 3)
    for version in (v1, v2, v3):
        registry.move_alias(NAME, "production", version, reason="approved")
    # the monitor found v2 drifted, but v3 was approved since: v3 stays
    result = rollback(registry, NAME, "production", None, expected=v2)
    assert result["moved"] is False and result["previous"] == v3
    assert str(client.get_model_version_by_alias(NAME, "production").version) == v3
    result = rollback(registry, NAME, "production", None, expected=v3)
    assert result["version"] == v2

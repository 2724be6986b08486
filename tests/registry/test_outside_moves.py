"""Alias moves made outside dbspec (issue 15, item 4): the history reconciles with the registry.

A move dbspec did not make (the UI, ``MlflowClient().set_registered_model_alias``) shows in
every read as an outside move from the last recorded holder; the next move under the lock
records it once, before its own entry, and ``rollback`` undoes it like any other move.
"""

from __future__ import annotations

import json

from tests.helpers.pause import kill_paused, run_until_paused
from tests.registry.conftest import NAME
from tests.registry.test_integrity import add_version, assert_chain, cli, holder_of, moves_of

ALIAS = "production"


def promoted(uri: str, client, tmp_path, count: int) -> list[str]:
    """``count`` versions, each promoted to ALIAS by ``dbspec promote --force`` in turn."""
    versions = [add_version(client, tmp_path, 60 - i) for i in range(count)]
    for version in versions:
        assert cli(uri, "promote", NAME, version, "--alias", ALIAS, "--force").returncode == 0
    return versions


def history_tags(client) -> dict[str, str]:
    return {k: v for k, v in client.get_registered_model(NAME).tags.items()
            if k.startswith("dbspec.alias_history.")}


def outside(moves: list[dict]) -> list[tuple]:
    return [(m["previous"], m["version"]) for m in moves if m.get("outside")]


def test_an_outside_move_shows_in_the_history_and_rollback_undoes_it(store, tmp_path):
    uri, client, registry = store
    one, two = promoted(uri, client, tmp_path, 2)
    client.set_registered_model_alias(NAME, ALIAS, one)  # the course's own rollback
    before = history_tags(client)

    moves = moves_of(registry, NAME, ALIAS)
    assert [(m["previous"], m["version"]) for m in moves] == [(None, one), (one, two), (two, one)]
    last = moves[-1]
    assert last["outside"] and last["by"] == "outside dbspec" and last["recorded"] is False
    assert last["reason"] == "moved outside dbspec" and last["id"] is None and last["at"]
    shown = cli(uri, "models", NAME)
    assert shown.returncode == 0
    assert f"-> v{one} (MOVED OUTSIDE DBSPEC, seen " in shown.stdout
    assert f"@{ALIAS} was moved outside dbspec (v{two} -> v{one}), first seen now" in shown.stdout
    as_json = json.loads(cli(uri, "models", NAME, "--format", "json").stdout)
    assert as_json["alias_history"][ALIAS][-1]["outside"] is True
    assert history_tags(client) == before  # reads write nothing

    back = cli(uri, "rollback", NAME, "--alias", ALIAS)
    assert back.returncode == 0 and f"-> v{two} (rolled back from v{one})" in back.stdout, \
        back.stderr
    assert holder_of(client, NAME, ALIAS) == two
    moves = moves_of(registry, NAME, ALIAS)
    assert [(m["previous"], m["version"], m["reason"]) for m in moves][2:] == [
        (two, one, "moved outside dbspec"), (one, two, "rollback")]
    assert moves[2]["id"] is not None and "recorded" not in moves[2]  # written, once
    assert_chain(moves, two)
    assert "first seen now" not in cli(uri, "models", NAME).stdout


def test_reads_take_no_lock(store, tmp_path):
    from dbspec.registry.commands import describe_models

    uri, client, registry = store
    one, two = promoted(uri, client, tmp_path, 2)
    client.set_registered_model_alias(NAME, ALIAS, one)
    registry.lock_wait_s = 0.5  # a read that waited for the lock would fail, not hang
    with registry.lock(NAME):
        described = describe_models(registry, NAME)
    assert outside(described["alias_history"][ALIAS]) == [(two, one)]


def test_a_promote_records_the_outside_move_before_its_own_entry(store, tmp_path):
    from dbspec.registry.promotion import promote

    uri, client, registry = store
    one, two = promoted(uri, client, tmp_path, 2)
    three = add_version(client, tmp_path, 40)
    client.set_registered_model_alias(NAME, ALIAS, one)
    promote(registry, NAME, three, ALIAS, force=True)
    moves = moves_of(registry, NAME, ALIAS)
    assert [(m["previous"], m["version"]) for m in moves][2:] == [(two, one), (one, three)]
    assert_chain(moves, three)
    assert moves[2]["seen_by"] and moves[2]["at"] <= moves[3]["at"]


def test_a_move_that_fails_its_gates_still_records_the_outside_move(store, tmp_path):
    from dbspec.registry import RegistryError
    from dbspec.registry.promotion import promote

    uri, client, registry = store
    one, two = promoted(uri, client, tmp_path, 2)
    gated = {"dbspec.decision": "pending",
             "dbspec.gates": json.dumps([{"metric": "test_rmse", "max": 1}])}
    worse = add_version(client, tmp_path, 70, **gated)
    client.set_registered_model_alias(NAME, ALIAS, one)
    try:
        promote(registry, NAME, worse, ALIAS, force=False)
        raise AssertionError("the gate should have failed")
    except RegistryError as exc:
        assert "fails its gates" in str(exc)
    moves = moves_of(registry, NAME, ALIAS)
    assert outside(moves) == [(two, one)] and moves[-1]["id"] is not None  # seen under the lock
    assert len(history_tags(client)) == 3


def test_an_alias_deleted_outside_dbspec(store, tmp_path):
    from dbspec.registry.commands import describe_models, render_models

    uri, client, registry = store
    one, two = promoted(uri, client, tmp_path, 2)
    client.delete_registered_model_alias(NAME, ALIAS)

    described = describe_models(registry, NAME)
    moves = described["alias_history"][ALIAS]
    assert moves[-1]["outside"] and (moves[-1]["previous"], moves[-1]["version"]) == (two, None)
    assert moves[-1]["reason"] == "deleted outside dbspec"
    text = render_models(described)
    assert "-> unset (DELETED OUTSIDE DBSPEC, seen " in text
    assert f"@{ALIAS} was deleted outside dbspec (v{two} -> unset)" in text

    back = cli(uri, "rollback", NAME, "--alias", ALIAS)  # sets it again on its last holder
    assert back.returncode == 0, back.stderr
    assert f"-> v{two} (rolled back from unset: deleted outside dbspec)" in back.stdout
    assert holder_of(client, NAME, ALIAS) == two
    moves = moves_of(registry, NAME, ALIAS)
    assert [(m["previous"], m["version"]) for m in moves][2:] == [(two, None), (None, two)]
    assert_chain(moves, two)


def test_an_alias_set_outside_dbspec_without_any_history(store, tmp_path):
    uri, client, registry = store
    one, two = add_version(client, tmp_path, 60), add_version(client, tmp_path, 55)
    client.set_registered_model_alias(NAME, ALIAS, one)

    moves = moves_of(registry, NAME, ALIAS)
    assert [(m["previous"], m["version"], m["reason"]) for m in moves] == [
        (None, one, "set outside dbspec")]
    refused = cli(uri, "rollback", NAME, "--alias", ALIAS)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"@{ALIAS} of {NAME} was set to v{one} outside dbspec and no earlier holder is " \
        "recorded; give --to VERSION" in refused.stderr
    assert holder_of(client, NAME, ALIAS) == one

    back = cli(uri, "rollback", NAME, "--alias", ALIAS, "--to", two)
    assert back.returncode == 0 and f"-> v{two} (rolled back from v{one})" in back.stdout
    moves = moves_of(registry, NAME, ALIAS)
    assert [(m["previous"], m["version"]) for m in moves] == [(None, one), (one, two)]
    assert moves[0]["id"] is not None
    assert_chain(moves, two)


def test_an_alias_never_set_still_has_no_earlier_holder(store, tmp_path):
    uri, client, registry = store
    add_version(client, tmp_path, 60)
    refused = cli(uri, "rollback", NAME, "--alias", ALIAS)
    assert refused.returncode == 1 and "has no earlier holder recorded" in refused.stderr
    from dbspec.registry.commands import describe_models

    assert ALIAS not in describe_models(registry, NAME)["alias_history"]
    assert history_tags(client) == {}


def test_a_killed_intent_then_an_outside_move_starts_from_the_real_holder(store, tmp_path):
    """A promote killed before its move leaves an intent; an outside move after it starts
    from the holder the intent never replaced."""
    uri, client, registry = store
    one, two = promoted(uri, client, tmp_path, 2)
    three = add_version(client, tmp_path, 40)
    paused = run_until_paused(["promote", NAME, three, "--alias", ALIAS, "--force",
                               "--tracking-uri", uri], "promote.before_move",
                              tmp_path / "paused")
    kill_paused(paused)
    client.set_registered_model_alias(NAME, ALIAS, one)
    moves = moves_of(registry, NAME, ALIAS)
    assert [(m["previous"], m["version"]) for m in moves] == [(None, one), (one, two), (two, one)]
    back = cli(uri, "rollback", NAME, "--alias", ALIAS)
    assert back.returncode == 0 and f"-> v{two} (rolled back from v{one})" in back.stdout
    assert_chain(moves_of(registry, NAME, ALIAS), two)


def test_a_kill_after_recording_the_outside_move_records_it_once(store, tmp_path):
    uri, client, registry = store
    one, two = promoted(uri, client, tmp_path, 2)
    client.set_registered_model_alias(NAME, ALIAS, one)
    paused = run_until_paused(["rollback", NAME, "--alias", ALIAS, "--tracking-uri", uri],
                              "history.after_outside", tmp_path / "paused")
    kill_paused(paused)
    moves = moves_of(registry, NAME, ALIAS)
    assert outside(moves) == [(two, one)] and moves[-1]["id"] is not None
    assert holder_of(client, NAME, ALIAS) == one

    back = cli(uri, "rollback", NAME, "--alias", ALIAS)  # the lock died with the process
    assert back.returncode == 0 and f"-> v{two} (rolled back from v{one})" in back.stdout
    moves = moves_of(registry, NAME, ALIAS)
    assert outside(moves) == [(two, one)] and len(history_tags(client)) == 4
    assert_chain(moves, two)


def test_an_outside_move_recorded_twice_counts_once(store, tmp_path):
    """Two writers that both recorded the same outside move (a lost lease race)."""
    uri, client, registry = store
    one, two = promoted(uri, client, tmp_path, 2)
    client.set_registered_model_alias(NAME, ALIAS, one)
    entry = {"version": one, "previous": two, "at": "2026-01-01T00:00:00Z",
             "by": "outside dbspec", "reason": "moved outside dbspec", "outside": True}
    for stamp in ("9" * 19 + "0-aaaa0000", "9" * 19 + "1-bbbb0000"):
        client.set_registered_model_tag(NAME, f"dbspec.alias_history.{ALIAS}.{stamp}",
                                        json.dumps(entry))
    moves = moves_of(registry, NAME, ALIAS)
    assert outside(moves) == [(two, one)]
    assert_chain(moves, one)

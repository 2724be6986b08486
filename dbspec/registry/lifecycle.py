"""Staged promotion's records and the lifecycle state read back from them. Tags (JSON):

- version ``dbspec.stages``: its spec's stages (``[{alias, gates, approval}]``), for several
  stages or one with approval; registered model ``dbspec.promotion_stages``: their aliases in
  order, the last one production.
- version ``dbspec.approval.<alias>``: ``{state: pending, gates, at, run_id, by}`` once it
  passed a stage with approval, ``{state: approved, by, at, requested_at, gates}`` once
  approved; ``by`` with ``verified`` (the store vouched for it) and ``os_user``.
- version ``dbspec.lifecycle``: ``{state: archived|restored, at, why, by}`` when it left the
  last stage's alias, or a rollback gave it back.

State: Production (holds the last stage's alias), Staging (an earlier one, or awaits approval),
Archived (held the last one once), Development.
"""

from __future__ import annotations

import getpass
import json
import os
import time
from typing import Any, NamedTuple, Optional

from dbspec.registry.errors import from_registry, unavailable
from dbspec.registry.history import RegistrySnapshot, load_json, now

STAGES_TAG = "dbspec.stages"
MODEL_STAGES_TAG = "dbspec.promotion_stages"
APPROVAL_TAG = "dbspec.approval.{alias}"
LIFECYCLE_TAG = "dbspec.lifecycle"
PENDING_APPROVAL, APPROVED, ARCHIVED, RESTORED = "pending", "approved", "archived", "restored"
DEVELOPMENT, STAGING, PRODUCTION = "Development", "Staging", "Production"
ARCHIVED_STATE = "Archived"


def acting_user() -> str:
    """``MLFLOW_TRACKING_USERNAME`` when set (the tracking server's user), else the OS user."""
    return os.environ.get("MLFLOW_TRACKING_USERNAME") or getpass.getuser()


def version_stages(tags: dict[str, str]) -> list[dict[str, Any]]:
    """The stages recorded on a version (``[{alias, gates, approval}]``)."""
    found = load_json(tags.get(STAGES_TAG), [])
    return [s for s in found if isinstance(s, dict) and "alias" in s] \
        if isinstance(found, list) else []


def model_stages(seen: RegistrySnapshot) -> list[str]:
    """The stage aliases in order, as the last run recorded them."""
    found = load_json(seen.tags.get(MODEL_STAGES_TAG), [])
    return [a for a in found if isinstance(a, str)] if isinstance(found, list) else []


class StageKey(NamedTuple):
    """A version at a promotion stage."""

    name: str
    version: str
    alias: str


def request_approval(client, at: StageKey, gates: list[str], run_id: Optional[str],
                     by: dict[str, Any]) -> None:
    """Record ``at.version`` as waiting for approval at ``at.alias``, asked by ``by`` (an
    identity's record: ``{by, verified, os_user}``)."""
    client.set_model_version_tag(at.name, at.version, APPROVAL_TAG.format(alias=at.alias),
                                 json.dumps({"state": PENDING_APPROVAL, "gates": gates,
                                             "at": now(), "ns": time.time_ns(),
                                             "run_id": run_id, **by}))


def record_approval(client, at: StageKey, gates: list[str], by: dict[str, Any],
                    requested: Optional[dict[str, Any]]) -> None:
    """Record who approved ``at.version`` for ``at.alias`` (``{by, verified, os_user}``), and
    when."""
    client.set_model_version_tag(at.name, at.version, APPROVAL_TAG.format(alias=at.alias),
                                 json.dumps({"state": APPROVED, **by, "at": now(),
                                             "ns": time.time_ns(), "gates": gates,
                                             "requested_at": (requested or {}).get("at"),
                                             "requested_ns": (requested or {}).get("ns")}))


def record_final_move(client, name: str, alias: str, outcome: Any, *,
                      final: Optional[str]) -> Optional[str]:
    """When ``alias`` is the last stage's (``final``) and the guarded move ``outcome`` moved
    it: the version it left is archived (when and why), the one it reached restored if it was
    archived.

    Returns:
        None, or a warning when the registry refused these records: the move happened (and the
        states are read from the alias history all the same), so it is told, not raised.
    """
    if not outcome.moved or alias != final:
        return None
    previous, target = outcome.previous, str(outcome.decision.version)
    why = outcome.decision.reason
    by = acting_user()
    try:
        if previous is not None and previous != target:
            client.set_model_version_tag(name, previous, LIFECYCLE_TAG, json.dumps(
                {"state": ARCHIVED, "at": now(), "ns": time.time_ns(), "by": by,
                 "why": f"left @{alias} for v{target} ({why})"}))
        if _state(client.get_model_version(name, target).tags or {}, LIFECYCLE_TAG) == ARCHIVED:
            client.set_model_version_tag(name, target, LIFECYCLE_TAG, json.dumps(
                {"state": RESTORED, "at": now(), "ns": time.time_ns(), "by": by,
                 "why": f"@{alias} back on it ({why})"}))
    except Exception as exc:
        if not from_registry(exc):
            raise
        return (f"@{alias} moved to v{target}, but the archive records could not be written: "
                f"{unavailable(exc, f'{LIFECYCLE_TAG} of {name}')}")
    return None


def _state(tags: dict[str, str], key: str) -> Optional[str]:
    """The ``state`` of the JSON record in tag ``key``."""
    found = load_json(tags.get(key))
    return found.get("state") if isinstance(found, dict) else None


def lifecycle_state(version: str, tags: dict[str, str], seen: RegistrySnapshot,
                    stages: list[str]) -> dict[str, Any]:
    """``{state, stages, awaiting}``: ``version``'s state, the stage aliases it holds and those
    it awaits approval for."""
    held = [a for a in stages if seen.holder(a) == version]
    # a request stands until another version takes the stage before (that supersedes it: it
    # can no longer be approved)
    awaiting = [a for a in stages if a not in held
                and _state(tags, APPROVAL_TAG.format(alias=a)) == PENDING_APPROVAL
                and (stages.index(a) == 0
                     or seen.holder(stages[stages.index(a) - 1]) in (None, version))]
    final = stages[-1] if stages else None
    if final is not None and final in held:
        state = PRODUCTION
    elif held or awaiting:
        state = STAGING
    elif _state(tags, LIFECYCLE_TAG) == ARCHIVED or (
            final is not None and any(m.get("version") == version
                                      for m in seen.history(final))):
        state = ARCHIVED_STATE
    else:
        state = DEVELOPMENT
    return {"state": state, "stages": held, "awaiting": awaiting}


def version_history(version: str, tags: dict[str, str],
                    seen: RegistrySnapshot) -> list[dict[str, Any]]:
    """What happened to ``version``, oldest first: stage entries and exits (alias history),
    approvals requested and given, archiving; events of one second in the order they happened
    (history entries and these records carry nanoseconds)."""
    events: list[tuple[str, int, dict[str, Any]]] = []

    def add(at: Any, ns: Any, event: str, **more: Any) -> None:
        events.append((at or "", ns or 0, {"at": at, "event": event, **more}))

    for alias in seen.history_aliases():
        for move in seen.history(alias):
            what = f"entered @{alias}" if move.get("version") == version else \
                f"left @{alias}" if move.get("previous") == version else None
            if what is not None:
                stamp = str(move.get("id") or "").split("-")[0]
                add(move.get("at"), int(stamp) if stamp.isdigit() else 0, what,
                    by=move.get("by"), reason=move.get("reason"))
    prefix = APPROVAL_TAG.format(alias="")
    for key in sorted(k for k in tags if k.startswith(prefix)):
        record, alias = load_json(tags[key]), key[len(prefix):]
        if not isinstance(record, dict):
            continue
        if record.get("state") == PENDING_APPROVAL:
            add(record.get("at"), record.get("ns"), f"awaits approval for @{alias}")
        elif record.get("state") == APPROVED:
            if record.get("requested_at"):
                add(record["requested_at"], record.get("requested_ns"),
                    f"awaits approval for @{alias}")
            add(record.get("at"), record.get("ns"), f"approved for @{alias}",
                by=record.get("by"))
    record = load_json(tags.get(LIFECYCLE_TAG))
    if isinstance(record, dict) and record.get("state"):
        add(record.get("at"), record.get("ns"), record["state"], by=record.get("by"),
            reason=record.get("why"))
    events.sort(key=lambda e: (e[0], e[1]))
    return [event for _, _, event in events]

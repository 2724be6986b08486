"""Rollback: an alias back to an earlier holder, through the promotion service's decisions
(:mod:`dbspec.registry.promotion` re-exports :func:`rollback`)."""

from __future__ import annotations

from typing import Optional

from dbspec.registry.client import AliasDecision, Registry
from dbspec.registry.errors import RegistryError
from dbspec.registry.gating import ROLLED_BACK, UNCHANGED, Decision
from dbspec.registry.history import RegistrySnapshot
from dbspec.registry.lifecycle import model_stages, record_final_move

_REASON = "rollback"


def rollback(registry: Registry, name: str, alias: str, to: Optional[str] = None, *,
             expected: Optional[str] = None) -> Decision:
    """Point ``alias`` back at ``to``, by default the version that held it before.

    "Before" comes from the moves that happened (an entry whose move was killed is skipped),
    read under the registry lock; rollbacks are skipped too, so repeated rollbacks step
    further back. A move made outside dbspec counts as a move (recorded here first, see
    :meth:`Registry.guarded_move`): rolling it back returns to the holder before it, and an
    alias deleted outside dbspec is set again on its last holder. On the last promotion
    stage's alias, the version rolled back from is archived and the one returned to restored.

    ``expected``: roll back only while this version holds the alias (checked under the lock);
    otherwise nothing moves and the decision is ``unchanged`` (``dbspec monitor`` rolls back
    the version that alerted, never one promoted since).

    Raises:
        RegistryError: the alias has no earlier holder (or was set outside dbspec without
            one), ``to`` is not a version, or the alias already points at it; on the last
            promotion stage's alias, ``to`` never held it (a rollback returns to a version
            that was deployed: a new one goes through promote and approve).
    """
    if to is not None:
        registry.version(name, str(to))
    final: list[Optional[str]] = []

    def decide(seen: RegistrySnapshot) -> AliasDecision:
        stages = model_stages(seen)
        final[:] = [stages[-1] if stages else None]
        current = seen.holder(alias)
        if expected is not None and current != str(expected):
            return AliasDecision(None, _REASON)
        target = str(to) if to is not None else seen.replaced(alias, current)
        _check_target(seen, name, alias, target, last=bool(stages) and stages[-1] == alias
                      and to is not None)
        return AliasDecision(target, _REASON)

    outcome = registry.guarded_move(name, alias, decide)
    if expected is not None and not outcome.moved:
        return Decision(name, alias, None, UNCHANGED, previous=outcome.previous)
    version = outcome.decision.version
    warning = record_final_move(registry.client, name, alias, outcome,
                                final=final[0] if final else None)
    return Decision(name, alias, None if version is None else str(version), ROLLED_BACK,
                    moved=outcome.moved, previous=outcome.previous, warning=warning)


def _check_target(seen: RegistrySnapshot, name: str, alias: str, target: Optional[str], *,
                  last: bool) -> None:
    """Refuse a rollback to nothing, to the holder itself, or (``last``: the last stage's
    alias, to a version given) to a version that never held the alias."""
    current = seen.holder(alias)
    if last and not _held(seen, alias, str(target)):
        raise RegistryError(f"v{target} of {name} never held @{alias}: a rollback returns "
                            "to a version that was deployed; a new one goes through "
                            "dbspec promote / approve")
    if target is None:
        moves = seen.history(alias)
        if moves and moves[-1].get("outside") and current is not None:
            raise RegistryError(f"@{alias} of {name} was set to v{current} outside dbspec "
                                "and no earlier holder is recorded; give --to VERSION")
        raise RegistryError(f"@{alias} of {name} has no earlier holder recorded; give "
                            "--to VERSION")
    if target == current:
        raise RegistryError(f"@{alias} of {name} already points at v{target}: nothing to "
                            "roll back; give --to VERSION for another version")


def _held(seen: RegistrySnapshot, alias: str, version: str) -> bool:
    """Whether ``version`` held ``alias`` at some point of its recorded history."""
    return any(version in (move.get("version"), move.get("previous"))
               for move in seen.history(alias))

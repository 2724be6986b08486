"""Alias history: one registered-model tag per move, read back into moves.

History is append-only, one tag per move; an entry whose move never happened (killed between
the two) does not match what followed it and is not taken as a move. An entry is rewritten
once, as ``applied``, right after its move: that tells a move that happened and was then
undone outside dbspec from one that never happened. A move made outside dbspec (the UI,
``MlflowClient().set_registered_model_alias``) shows in every read as an entry
``"outside": true`` from the last recorded holder to the actual one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Optional

HISTORY_TAG = "dbspec.alias_history.{alias}"  # one JSON list: the format before entry tags
#: ``by`` of a history entry for a move dbspec did not make, only saw.
OUTSIDE_BY = "outside dbspec"


@dataclass(frozen=True)
class RegistrySnapshot:
    """One read of a registered model: its aliases and tags (history included)."""

    name: str
    aliases: dict[str, str]
    tags: dict[str, str]

    def holder(self, alias: str) -> Optional[str]:
        """The version holding ``alias``, or None."""
        return self.aliases.get(alias)

    def history(self, alias: str, *, unapplied: bool = False) -> list[dict[str, Any]]:
        """The moves of ``alias``, oldest first; with ``unapplied``, also the entries whose move
        never happened (each entry then says ``applied``).

        When the alias is not where the last recorded move left it (moved, set or deleted
        outside dbspec), the last entry is that outside move (``"outside": true``); until a
        move under the lock records it, it has ``"recorded": false``, no ``id`` and this read's
        time as ``at``.
        """
        entries = _history_entries(self.tags, alias, self.holder(alias))
        return entries if unapplied else [e for e in entries if e["applied"]]

    def unrecorded(self, alias: str) -> Optional[dict[str, Any]]:
        """The outside move of ``alias`` this read sees and the history does not hold yet."""
        entries = self.history(alias)
        return entries[-1] if entries and entries[-1].get("recorded") is False else None

    def history_aliases(self) -> list[str]:
        """The aliases set now, then those only the history knows (deleted since), sorted."""
        prefix = HISTORY_TAG.format(alias="")
        known = {key[len(prefix):].split(".")[0] for key in self.tags if key.startswith(prefix)}
        return [*self.aliases, *sorted(known - set(self.aliases))]

    def replaced(self, alias: str, version: Optional[str]) -> Optional[str]:
        """The version ``alias`` held before ``version`` was last promoted or moved to it
        (rollbacks skipped, so repeated rollbacks step further back); ``version`` None: the
        holder before the alias was deleted outside dbspec."""
        for move in reversed(self.history(alias)):
            if move["version"] == version and move["reason"] != "rollback":
                return move.get("previous")
        return None


def _history_entries(tags: dict[str, str], alias: str, holder: Optional[str]) -> list[dict]:
    """One entry per tag in key order, then the outside move that
    took the alias from the last applied entry's version to ``holder``, if it is elsewhere.

    An entry is ``applied`` when it was rewritten so after its move, or when what followed it
    starts from its version (the next entry's ``previous``, or the holder for the last one):
    an intent whose move was killed is not. A recorded outside move is one unless it changes
    nothing (two writers that both recorded it, after a lost lease).
    """
    base = HISTORY_TAG.format(alias=alias)
    stored = []
    for key in sorted(k for k in tags if k.startswith(base + ".")):
        entry = _load_entry(tags[key])
        if entry is not None:
            stored.append({**entry, "id": key[len(base) + 1:]})
    for index, entry in enumerate(stored):
        after = stored[index + 1].get("previous") if index + 1 < len(stored) else holder
        entry["applied"] = entry.get("applied") is True or after == entry.get("version")
    entries, recorded = stored, None
    for entry in entries:
        if entry.get("outside"):
            entry["applied"] = entry.get("version") != recorded
        if entry["applied"]:
            recorded = entry.get("version")
    if recorded != holder:
        entries.append({**_outside_move(recorded, holder), "id": None, "applied": True,
                        "recorded": False})
    return entries


def _outside_move(previous: Optional[str], version: Optional[str]) -> dict[str, Any]:
    """The history entry of a move from ``previous`` to ``version`` that dbspec only saw."""
    what = "deleted" if version is None else "set" if previous is None else "moved"
    return {"version": version, "previous": previous, "at": now(), "by": OUTSIDE_BY,
            "reason": f"{what} outside dbspec", "outside": True}


def _load_entry(raw: str) -> Optional[dict]:
    try:
        entry = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return entry if isinstance(entry, dict) and "version" in entry else None


def now() -> str:
    """This moment as history entries record it, UTC to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

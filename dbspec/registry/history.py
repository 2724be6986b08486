"""Alias history: one registered-model tag per move, read back into moves.

An entry is written before its move (an intent) and rewritten once, ``applied``, right after
it: that tells a move undone outside dbspec from one that never happened (an intent not
followed by what came after it). A move made outside dbspec (the UI, the client) shows in
every read as an entry ``"outside": true`` from the last recorded holder to the actual one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Optional

HISTORY_TAG = "dbspec.alias_history.{alias}"  # + ".<ns>-<random>", one tag per entry
OUTSIDE_BY = "outside dbspec"


@dataclass(frozen=True)
class RegistrySnapshot:
    """One read of a registered model: its aliases and tags (history included)."""

    name: str
    aliases: dict[str, str]
    tags: dict[str, str]

    def holder(self, alias: str) -> Optional[str]:
        return self.aliases.get(alias)

    def history(self, alias: str, *, unapplied: bool = False) -> list[dict[str, Any]]:
        """The moves of ``alias``, oldest first (``unapplied``: also intents never carried out).

        An alias not where the last recorded move left it ends on that outside move
        (``"outside": true``); until a move under the lock records it, it has ``"recorded":
        false``, no ``id``, and this read's time as ``at``.
        """
        entries = _history_entries(self.tags, alias, self.holder(alias))
        return entries if unapplied else [e for e in entries if e["applied"]]

    def unrecorded(self, alias: str) -> Optional[dict[str, Any]]:
        """The outside move of ``alias`` this read sees and the history does not hold yet."""
        entries = self.history(alias)
        return entries[-1] if entries and entries[-1].get("recorded") is False else None

    def history_aliases(self) -> list[str]:
        """The aliases set now, then those only the history knows (deleted since)."""
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
    """One entry per tag in key order, then the outside move from the last applied entry's
    version to ``holder``, if it is elsewhere.

    An entry is ``applied`` when rewritten so, or when what followed starts from its version
    (the next entry's ``previous``, or the holder): a killed move's intent is not. A recorded
    outside move counts unless it changes nothing (two writers that both recorded it).
    """
    base = HISTORY_TAG.format(alias=alias)
    stored = []
    for key in sorted(k for k in tags if k.startswith(base + ".")):
        entry = load_json(tags[key])
        if isinstance(entry, dict) and "version" in entry:
            stored.append({**entry, "id": key[len(base) + 1:]})
    for index, entry in enumerate(stored):
        after = stored[index + 1].get("previous") if index + 1 < len(stored) else holder
        entry["applied"] = entry.get("applied") is True or after == entry.get("version")
    recorded = None
    for entry in stored:
        if entry.get("outside"):
            entry["applied"] = entry.get("version") != recorded
        if entry["applied"]:
            recorded = entry.get("version")
    if recorded != holder:
        what = "deleted" if holder is None else "set" if recorded is None else "moved"
        stored.append({"version": holder, "previous": recorded, "at": now(), "by": OUTSIDE_BY,
                       "reason": f"{what} outside dbspec", "outside": True, "id": None,
                       "applied": True, "recorded": False})
    return stored


def load_json(raw: Optional[str], default: Any = None) -> Any:
    """``raw`` parsed; ``default`` when absent or not JSON (a tag written by hand)."""
    try:
        return json.loads(raw) if raw else default
    except json.JSONDecodeError:
        return default


def now() -> str:
    """Now, UTC to the second, as records keep it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

"""MLflow model registry: versions, promotion gates, aliases and their history.

Integrity under ``kill -9`` and concurrency (what holds on which store is in the README's
"Registry guarantees"):

- A version is created already tagged ``dbspec.decision=pending`` (the tag travels with
  ``create_model_version``), so a kill before its gates ran never leaves a version that looks
  decided. A rerun of the same training run adopts that version instead of registering a
  duplicate; pending versions of dead processes are tagged ``abandoned``.
- Every alias move (promotion, ``promote``, ``rollback``) runs in :meth:`Registry.guarded_move`:
  under a registry-wide lock, the caller decides on the holders it sees, the history entry is
  written first (an intent), and the holder is re-read right before and after the move; a
  changed holder means deciding again against the new one.
- History is append-only, one tag per move; an entry whose move never happened (killed between
  the two) does not match what followed it and is not taken as a move. An entry is rewritten
  once, as ``applied``, right after its move: that tells a move that happened and was then
  undone outside dbspec from one that never happened.
- A move made outside dbspec (the UI, ``MlflowClient().set_registered_model_alias``) shows in
  every read as an entry ``"outside": true`` from the last recorded holder to the actual one;
  the next move under the lock writes it into the history before its own entry, so it is
  recorded once, when first seen. Reads take no lock and write nothing.
"""

from __future__ import annotations

import getpass
import json
import re
import secrets
import socket
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterator, Optional

from dbspec.faults import pause_point
from dbspec.processes import owner, process_alive
from dbspec.registry.errors import RegistryError
from dbspec.registry.locks import Lease, TagLease, file_lock
from dbspec.spec.sections.lifecycle import Gate
from dbspec.spec.semantics import lower_is_better
from dbspec.tracking.stores import sqlite_path

HISTORY_TAG = "dbspec.alias_history.{alias}"  # one JSON list: the format before entry tags
#: ``by`` of a history entry for a move dbspec did not make, only saw.
OUTSIDE_BY = "outside dbspec"
DECISION_TAG = "dbspec.decision"
RUN_TAG = "dbspec.run_id"
GATES_TAG = "dbspec.gates"
OWNER_TAG = "dbspec.pending_owner"  # host:pid of the process that is gating the version
ABANDONED_TAG = "dbspec.abandoned"  # when and why a version was tagged abandoned
PENDING, ABANDONED, UNGATED = "pending", "abandoned", "ungated"
#: Decisions after which a version is no longer "not validated".
DECIDED = ("promoted", "rejected", "forced")
#: A pending version whose owner cannot be checked (another host) counts as dead after this.
PENDING_GRACE_S = 3600.0
_MOVE_ATTEMPTS = 5
_MODEL_VERSIONS_TAG = "mlflow.modelVersions"
# MLflow 3's URI of a logged model: one path segment, no alias (models:/NAME/1 is a version)
_LOGGED_MODEL_URI = re.compile(r"^models:/(?P<model_id>[^/@]+)$")


@dataclass(frozen=True)
class GateResult:
    """The outcome of one gate for one version."""

    metric: str
    condition: str
    value: Optional[float]
    reference: Optional[float]
    passed: bool
    note: str = ""

    def describe(self) -> str:
        """``test_rmse=54.21 <= 65: pass``."""
        shown = "missing" if self.value is None else f"{self.value:.6g}"
        verdict = "pass" if self.passed else "FAIL"
        note = f" ({self.note})" if self.note else ""
        return f"{self.metric}={shown} {self.condition}: {verdict}{note}"


def check_gates(gates: list[Gate], metrics: dict[str, float],
                reference: Callable[[str, str], Optional[float]]) -> list[GateResult]:
    """Evaluate every gate against a version's metrics.

    Args:
        gates: The spec's promotion gates.
        metrics: The candidate's metrics (``test_rmse``...).
        reference: ``(alias, metric) -> value`` of the alias's current holder, or None when
            the alias is unset.
    """
    results = []
    for gate in gates:
        value = metrics.get(gate.metric)
        if gate.min is not None or gate.max is not None:
            bounds = " and ".join(part for part in (
                f">= {gate.min:g}" if gate.min is not None else "",
                f"<= {gate.max:g}" if gate.max is not None else "") if part)
            passed = value is not None and (gate.min is None or value >= gate.min) and \
                (gate.max is None or value <= gate.max)
            results.append(GateResult(gate.metric, bounds, value, None, passed))
        if gate.better_than is not None:
            results.append(_versus(gate, value, reference(gate.better_than, gate.metric)))
    return results


def _versus(gate: Gate, value: Optional[float], champion: Optional[float]) -> GateResult:
    minimize = lower_is_better(gate.metric)
    sign = "<=" if minimize else ">="
    condition = f"{sign} @{gate.better_than}" + (f" ± {gate.tolerance:g}" if gate.tolerance else "")
    if champion is None:
        return GateResult(gate.metric, condition, value, None, value is not None,
                          f"no version holds @{gate.better_than} yet")
    if value is None:
        return GateResult(gate.metric, condition, None, champion, False)
    passed = value <= champion + gate.tolerance if minimize else value >= champion - gate.tolerance
    return GateResult(gate.metric, condition, value, champion, passed,
                      f"@{gate.better_than} has {champion:.6g}")


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

    def reference(self, alias: str, candidate: str) -> Optional[str]:
        """The champion ``candidate`` is compared with on ``alias``: the holder, or the version
        the candidate replaced when it holds the alias already (a promotion killed after the
        move and resumed)."""
        holder = self.holder(alias)
        return self.replaced(alias, candidate) if holder == candidate else holder


@dataclass(frozen=True)
class AliasDecision:
    """What a caller of :meth:`Registry.guarded_move` wants, given the holders it saw.

    Attributes:
        version: Where the alias should point; None leaves it where it is.
        reason: Recorded in the history entry.
        detail: The caller's own data (its gate results), handed back in the outcome.
    """

    version: Optional[str]
    reason: str = ""
    detail: Any = None


@dataclass(frozen=True)
class AliasOutcome:
    """The last decision taken, the holder it replaced and whether the alias moved."""

    decision: AliasDecision
    previous: Optional[str]
    moved: bool


@dataclass(frozen=True)
class RegisteredVersion:
    """The version :meth:`Registry.register` made or adopted, and the versions it abandoned."""

    version: str
    adopted: bool = False
    abandoned: tuple[str, ...] = field(default=())


class Registry:
    """Registered versions, gate records and aliases of one MLflow registry."""

    #: Tag lease (stores other than SQLite): how long it is valid, how long a writer waits
    #: between writing it and reading it back, and how long to wait for a busy lease.
    lease_ttl_s = 120.0
    lease_settle_s = 0.3
    lock_wait_s = 300.0

    def __init__(self, client):
        self.client = client

    def register(self, name: str, model_uri: str, run_id: str, tags: dict[str, str], *,
                 decision: str = PENDING) -> RegisteredVersion:
        """A version of ``name`` from ``model_uri``, created pending, or the undecided version
        an interrupted register of the same run left behind (adopted, not duplicated).

        Pending versions whose process is dead are tagged ``abandoned`` on the way.

        Args:
            name: The registered model (created if missing).
            model_uri: What :meth:`Tracker.log_model` returned, ``models:/<model_id>``.
            run_id: The training run, linked from the version.
            tags: Version tags.
            decision: The version's decision until its gates run: ``pending``, or ``ungated``
                when no promotion will gate it (then only ``promote --force`` moves an alias
                to it).
        """
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self.client.create_registered_model(name)
        model_id = logged_model_id(model_uri)
        tags = {**tags, RUN_TAG: run_id, DECISION_TAG: decision, OWNER_TAG: owner()}
        same = sorted((v for v in self._search(name, RUN_TAG, run_id)
                       if v.source == model_uri or model_id is not None and v.model_id == model_id),
                      key=lambda v: int(v.version))
        # the same training run and model are the same version, the first one registered: a
        # decided one is reused (a rerun of evaluate, --only, --resume after the end), an
        # undecided one adopted (a kill inside register)
        adopted = same[0] if same else None
        extras = [v for v in same[1:] if _undecided(v)]
        abandoned = [str(v.version) for v in extras]  # duplicates of an older bug
        for extra in extras:
            self._abandon(name, str(extra.version), f"duplicate of v{adopted.version}")
        abandoned += self._abandon_dead(name, keep=str(adopted.version) if adopted else None)
        if adopted is not None:
            keep_decision = not _undecided(adopted)  # its gates run again; until then it stands
            for key, value in tags.items():
                if keep_decision and key in (DECISION_TAG, OWNER_TAG):
                    continue
                self.client.set_model_version_tag(name, str(adopted.version), key, value)
            if ABANDONED_TAG in (adopted.tags or {}):
                self.client.delete_model_version_tag(name, str(adopted.version), ABANDONED_TAG)
            version = adopted
        else:
            # a REST store (mlflow server, Databricks) refuses a models:/<id> source without
            # its model_id; the SQLite store accepts it either way
            version = self.client.create_model_version(name, model_uri, run_id=run_id,
                                                       tags=tags, model_id=model_id)
            pause_point("register.after_create")
        deadline = time.monotonic() + 300
        while version.status == "PENDING_REGISTRATION" and time.monotonic() < deadline:
            time.sleep(0.2)
            version = self.client.get_model_version(name, version.version)
        if model_id is not None:
            self._link_logged_model(model_id, name, str(version.version))
        return RegisteredVersion(str(version.version), adopted is not None, tuple(abandoned))

    def _abandon_dead(self, name: str, keep: Optional[str]) -> list[str]:
        """Tag ``abandoned`` every pending version (but ``keep``) whose gating process is gone."""
        found = []
        for version in self._search(name, DECISION_TAG, PENDING):
            if str(version.version) != keep and self._owner_is_dead(version):
                self._abandon(name, str(version.version), "its process died before gating it")
                found.append(str(version.version))
        return found

    def _owner_is_dead(self, version) -> bool:
        """The version's run FAILED or KILLED, or its owner process is not running (checked on
        this host; an owner elsewhere counts as dead after :data:`PENDING_GRACE_S`)."""
        from mlflow.exceptions import MlflowException

        try:
            if version.run_id and self.client.get_run(version.run_id).info.status in (
                    "FAILED", "KILLED"):
                return True
        except MlflowException:
            return True  # the run is gone
        host, _, pid = (version.tags or {}).get(OWNER_TAG, "").rpartition(":")
        if host == socket.gethostname() and pid.isdigit():
            return not process_alive(int(pid))
        age = time.time() - (version.creation_timestamp or 0) / 1000
        return bool(host) and age > PENDING_GRACE_S

    def _abandon(self, name: str, version: str, why: str) -> None:
        self.client.set_model_version_tag(name, version, DECISION_TAG, ABANDONED)
        self.client.set_model_version_tag(name, version, ABANDONED_TAG, f"{_now()}: {why}")

    def _search(self, name: str, tag: str, value: str) -> list[Any]:
        """Versions of ``name`` whose ``tag`` is ``value``, newest first."""
        from mlflow.exceptions import MlflowException

        try:
            found = self.client.search_model_versions(
                f"name = '{name}' and tags.`{tag}` = '{value}'")
        except MlflowException:  # a store without tag filters (Unity Catalog): filter here
            found = [v for v in self.client.search_model_versions(f"name = '{name}'")
                     if (v.tags or {}).get(tag) == value]
        return sorted(found, key=lambda v: int(v.version), reverse=True)

    def _link_logged_model(self, model_id: str, name: str, version: str) -> None:
        """Record the version on the logged model, as ``mlflow.register_model`` does (the UI
        links the two through this tag). A tracking server records it itself; the SQLite
        store does not."""
        model = self.client.get_logged_model(model_id)
        linked = json.loads(model.tags.get(_MODEL_VERSIONS_TAG, "[]"))
        if any(entry.get("name") == name and str(entry.get("version")) == version
               for entry in linked):
            return
        linked.append({"name": name, "version": version})
        self.client.set_logged_model_tags(model_id, {_MODEL_VERSIONS_TAG: json.dumps(linked)})

    def holder(self, name: str, alias: str) -> Optional[Any]:
        """The version holding ``alias``, or None."""
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_model_version_by_alias(name, alias)
        except MlflowException:
            return None

    def record_gates(self, name: str, version: str, results: list[GateResult], decision: str) -> None:
        """Store each gate result and the decision as tags on the version."""
        for index, result in enumerate(results):
            self.client.set_model_version_tag(name, version, f"dbspec.gate.{index}",
                                              json.dumps(asdict(result)))
        self.client.set_model_version_tag(name, version, DECISION_TAG, decision)

    def snapshot(self, name: str) -> RegistrySnapshot:
        """Aliases and tags of ``name`` in one read."""
        model = self._model(name)
        return RegistrySnapshot(name, {a: str(v) for a, v in (model.aliases or {}).items()},
                                dict(model.tags or {}))

    def guarded_move(self, name: str, alias: str,
                     decide: Callable[[RegistrySnapshot], AliasDecision]) -> AliasOutcome:
        """Move ``alias`` where ``decide`` says, atomically with respect to other dbspec writers.

        Under :meth:`lock`: read the model, ``decide`` on it, append the history entry (before
        the move, so a kill cannot leave a move without one), re-read and move only if the
        holder is still the one decided on, re-read after the move; a holder that changed in
        between (a writer without the lock, an expired lease) means deciding again on what is
        there now. ``decide`` may raise :class:`RegistryError` to refuse.

        Raises:
            RegistryError: the refusal of ``decide``, the lock could not be had, or the alias
                kept changing under the move.
        """
        from mlflow.exceptions import MlflowException

        with self.lock(name) as lease:
            for _ in range(_MOVE_ATTEMPTS):
                seen = self.snapshot(name)
                if not lease.held(seen.tags):
                    continue  # the lease ran out and was taken again: read anew
                seen = self._record_outside_move(seen, alias)
                old = seen.holder(alias)
                decision = decide(seen)
                if decision.version is None or str(decision.version) == old:
                    return AliasOutcome(decision, old, moved=False)
                target = str(decision.version)
                entry = {"version": target, "previous": old, "at": _now(),
                         "by": getpass.getuser(), "reason": decision.reason}
                seen, key = self._append_history(seen, alias, entry)
                pause_point("promote.before_move")
                if not lease.held() or self._holder_version(name, alias) != old:
                    continue  # moved since we decided: decide again on the new holder
                try:
                    self.client.set_registered_model_alias(name, alias, target)
                except MlflowException as exc:
                    raise RegistryError(f"cannot set @{alias} on {name} v{target}: "
                                        f"{exc.message.splitlines()[0]}") from None
                pause_point("promote.after_move")
                # the move happened: whatever moves the alias later, this entry stays a move
                self.client.set_registered_model_tag(name, key,
                                                     json.dumps({**entry, "applied": True}))
                if self._holder_version(name, alias) == target:
                    return AliasOutcome(decision, old, moved=True)
        raise RegistryError(f"@{alias} of {name} kept changing while dbspec moved it "
                            f"({_MOVE_ATTEMPTS} tries): something moves it without dbspec's "
                            "lock; try again")

    def _holder_version(self, name: str, alias: str) -> Optional[str]:
        found = self.holder(name, alias)
        return str(found.version) if found is not None else None

    def move_alias(self, name: str, alias: str, version: str, *, reason: str) -> Optional[str]:
        """Point ``alias`` at ``version`` unconditionally (with its history); returns the old
        holder."""
        return self.guarded_move(name, alias, lambda _: AliasDecision(version, reason)).previous

    def _record_outside_move(self, seen: RegistrySnapshot, alias: str) -> RegistrySnapshot:
        """Write the outside move ``seen`` shows for ``alias`` into the history (under the
        lock, before any entry of this writer); ``seen`` with it."""
        move = seen.unrecorded(alias)
        if move is None:
            return seen
        entry = {k: v for k, v in move.items() if k not in ("id", "applied", "recorded")}
        seen, _ = self._append_history(seen, alias, {**entry, "seen_by": getpass.getuser()})
        pause_point("history.after_outside")
        return seen

    def _append_history(self, seen: RegistrySnapshot, alias: str,
                        entry: dict) -> tuple[RegistrySnapshot, str]:
        """One new tag per move, keyed by time (never before the newest entry, whatever the
        clocks say) and a random part, so concurrent writers never overwrite each other.
        Returns ``seen`` with the tag and the tag's key."""
        base = HISTORY_TAG.format(alias=alias) + "."
        stamps = [int(k[len(base):].split("-")[0]) for k in seen.tags
                  if k.startswith(base) and k[len(base):].split("-")[0].isdigit()]
        stamp = max([time.time_ns(), *(s + 1 for s in stamps)])
        key = f"{base}{stamp:020d}-{secrets.token_hex(4)}"
        value = json.dumps(entry)
        self.client.set_registered_model_tag(seen.name, key, value)
        return replace(seen, tags={**seen.tags, key: value}), key

    def history(self, name: str, alias: str) -> list[dict[str, Any]]:
        """Every move of ``alias`` that happened, oldest first."""
        return self.snapshot(name).history(alias)

    @contextmanager
    def lock(self, name: str) -> Iterator[Lease]:
        """Exclusive access to ``name``'s aliases among dbspec processes.

        A SQLite store: an ``flock`` on a file beside the database (every process on this
        host). Any other store (an mlflow server, Databricks): a lease in the registered
        model's ``dbspec.lock`` tag, see :class:`~dbspec.registry.locks.TagLease`.
        """
        database = sqlite_path(getattr(self.client, "_registry_uri", None) or "")
        path = None if database is None else str(database)
        if path is None:
            lease = TagLease(self, name)
            lease.acquire()
            try:
                yield lease
            finally:
                lease.release()
            return
        with file_lock(f"{path}.dbspec-lock", self.lock_wait_s):
            yield Lease()

    def versions(self, name: str) -> list[Any]:
        """Every version of ``name``, newest first."""
        self._model(name)
        found = self.client.search_model_versions(f"name = '{name}'")
        return sorted(found, key=lambda v: int(v.version), reverse=True)

    def version(self, name: str, version: str) -> Any:
        from mlflow.exceptions import MlflowException

        self._model(name)
        try:
            return self.client.get_model_version(name, version)
        except MlflowException:
            raise RegistryError(f"{name} has no version {version}") from None

    def _model(self, name: str) -> Any:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_registered_model(name)
        except MlflowException:
            names = [m.name for m in self.client.search_registered_models()]
            from dbspec.errors import did_you_mean

            raise RegistryError(f"no registered model '{name}'{did_you_mean(name, names)}; "
                                f"known: {', '.join(names) or 'none'}") from None


def _history_entries(tags: dict[str, str], alias: str, holder: Optional[str]) -> list[dict]:
    """The legacy JSON list, then one entry per tag in key order, then the outside move that
    took the alias from the last applied entry's version to ``holder``, if it is elsewhere.

    An entry is ``applied`` when it was rewritten so after its move, or when what followed it
    starts from its version (the next entry's ``previous``, or the holder for the last one):
    an intent whose move was killed is not. A recorded outside move is one unless it changes
    nothing (two writers that both recorded it, after a lost lease).
    """
    base = HISTORY_TAG.format(alias=alias)
    legacy = [{**e, "applied": True} for e in _load_list(tags.get(base))]
    stored = []
    for key in sorted(k for k in tags if k.startswith(base + ".")):
        entry = _load_entry(tags[key])
        if entry is not None:
            stored.append({**entry, "id": key[len(base) + 1:]})
    for index, entry in enumerate(stored):
        after = stored[index + 1].get("previous") if index + 1 < len(stored) else holder
        entry["applied"] = entry.get("applied") is True or after == entry.get("version")
    entries, recorded = legacy + stored, None
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
    return {"version": version, "previous": previous, "at": _now(), "by": OUTSIDE_BY,
            "reason": f"{what} outside dbspec", "outside": True}


def _load_list(raw: Optional[str]) -> list[dict]:
    try:
        found = json.loads(raw) if raw else []
    except json.JSONDecodeError:
        return []
    return [e for e in found if isinstance(e, dict) and "version" in e] \
        if isinstance(found, list) else []


def _load_entry(raw: str) -> Optional[dict]:
    try:
        entry = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return entry if isinstance(entry, dict) and "version" in entry else None


def _undecided(version) -> bool:
    return (version.tags or {}).get(DECISION_TAG) not in DECIDED


def logged_model_id(model_uri: str) -> Optional[str]:
    """The model id in an MLflow 3 logged model URI (``models:/m-...``); None for any other
    URI (``runs:/...``, a path), which a registry takes without a model id."""
    found = _LOGGED_MODEL_URI.match(model_uri)
    return found["model_id"] if found else None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

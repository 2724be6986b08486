"""MLflow model registry: versions, gate records and guarded alias moves.

Under ``kill -9`` and concurrency (docs/operations/registry.md): a version is created tagged
pending, so a kill never leaves one that looks decided, and a rerun of its run adopts it; every
alias move runs in :meth:`Registry.guarded_move`; a move made outside dbspec shows in every
read and is recorded by the next move under the lock. Reads take no lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from dbspec.faults import pause_point
from dbspec.filelocks import HostLock, LockBusy
from dbspec.processes import owner
from dbspec.registry.aliases import alias_holder
from dbspec.registry.errors import (RegistryError, is_not_found, is_permission_denied,
                                    refusals_said_as, unavailable)
from dbspec.registry.history import HISTORY_TAG, RegistrySnapshot, now
from dbspec.registry.lifecycle import acting_user
from dbspec.registry.pending import (ABANDONED_TAG, DECISION_TAG, OWNER_TAG, PENDING, abandon,
                                     abandon_dead, search_versions)
from dbspec.seams.gates import GateResult
from dbspec.tracking.stores import sqlite_path

RUN_TAG = "dbspec.run_id"
GATES_TAG = "dbspec.gates"
UNGATED = "ungated"
#: Decisions after which a version is no longer "not validated".
DECIDED = ("promoted", "rejected", "forced")
_MOVE_ATTEMPTS = 5
_MODEL_VERSIONS_TAG = "mlflow.modelVersions"
# MLflow 3's URI of a logged model: one path segment, no alias (models:/NAME/1 is a version)
_LOGGED_MODEL_URI = re.compile(r"^models:/(?P<model_id>[^/@]+)$")


@dataclass(frozen=True)
class AliasDecision:
    """What a caller of :meth:`Registry.guarded_move` wants, given the holders it saw: where
    the alias should point (None: where it is), ``reason`` and ``by`` for the history entry,
    ``detail`` (its gate results) handed back in the outcome."""

    version: Optional[str]
    reason: str = ""
    detail: Any = None
    by: Optional[str] = None


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

    #: How long a writer waits for the registry lock another dbspec process holds.
    lock_wait_s = 300.0

    def __init__(self, client):
        self.client = client

    @refusals_said_as("register a version of {name}", "EDIT on the registered model (and READ "
                      "on the training run)")
    def register(self, name: str, model_uri: str, run_id: str, tags: dict[str, str], *,
                 decision: str = PENDING) -> RegisteredVersion:
        """A version of ``name`` (created if missing) from ``model_uri`` (``models:/<id>``),
        created pending, or the version an earlier register of the same run made (adopted, not
        duplicated). Pending versions whose process is dead are tagged ``abandoned`` on the way.

        Args:
            decision: The decision until its gates run: ``pending``, or ``ungated`` when no
                promotion will gate it (then only ``promote --force`` moves an alias to it).
        """
        self._ensure_model(name)
        model_id = logged_model_id(model_uri)
        tags = {**tags, RUN_TAG: run_id, DECISION_TAG: decision, OWNER_TAG: owner()}
        same = sorted((v for v in search_versions(self.client, name, RUN_TAG, run_id)
                       if v.source == model_uri or model_id is not None and v.model_id == model_id),
                      key=lambda v: int(v.version))
        # the same training run and model are the same version, the first one registered: a
        # decided one is reused (a rerun of evaluate, --only, --resume after the end), an
        # undecided one adopted (a kill inside register)
        adopted = same[0] if same else None
        extras = [v for v in same[1:] if _undecided(v)]
        abandoned = [str(v.version) for v in extras]  # duplicates of an older bug
        for extra in extras:  # there are extras only when something was adopted
            abandon(self.client, name, str(extra.version), f"duplicate of v{same[0].version}")
        abandoned += abandon_dead(self.client, name,
                                  keep=str(adopted.version) if adopted else None)
        if adopted is not None:
            version = self._adopt(name, adopted, tags)
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

    def _ensure_model(self, name: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(name)
        except MlflowException as exc:
            if not is_not_found(exc) and not is_permission_denied(exc):
                raise unavailable(exc, f"registered model '{name}'") from None
            # a server with auth and default_permission NO_PERMISSIONS answers 403, not 404, for
            # a model that does not exist yet (nobody holds a grant on it): creating tells apart
            try:
                self.client.create_registered_model(name)
            except MlflowException as created:
                if is_permission_denied(exc) and created.error_code == "RESOURCE_ALREADY_EXISTS":
                    raise unavailable(exc, f"registered model '{name}'") from None
                raise

    def _adopt(self, name: str, adopted: Any, tags: dict[str, str]) -> Any:
        """Re-tag a version of the same run; a decided one keeps its decision until its gates
        run again."""
        keep_decision = not _undecided(adopted)
        for key, value in tags.items():
            if keep_decision and key in (DECISION_TAG, OWNER_TAG):
                continue
            self.client.set_model_version_tag(name, str(adopted.version), key, value)
        if ABANDONED_TAG in (adopted.tags or {}):
            self.client.delete_model_version_tag(name, str(adopted.version), ABANDONED_TAG)
        return adopted

    def _link_logged_model(self, model_id: str, name: str, version: str) -> None:
        """Record the version on the logged model, as ``mlflow.register_model`` does (the UI
        links them by this tag); the SQLite store, unlike a server, does not."""
        model = self.client.get_logged_model(model_id)
        linked = json.loads(model.tags.get(_MODEL_VERSIONS_TAG, "[]"))
        if any(entry.get("name") == name and str(entry.get("version")) == version
               for entry in linked):
            return
        linked.append({"name": name, "version": version})
        self.client.set_logged_model_tags(model_id, {_MODEL_VERSIONS_TAG: json.dumps(linked)})

    def holder(self, name: str, alias: str) -> Optional[Any]:
        """The version holding ``alias``; None only when the registry confirms none does
        (:func:`~dbspec.registry.aliases.alias_holder`)."""
        return alias_holder(self.client, name, alias)

    def record_gates(self, name: str, version: str, results: list[GateResult],
                     decision: str) -> None:
        """Store each gate result and the decision as tags on the version."""
        for index, result in enumerate(results):
            self.client.set_model_version_tag(name, version, f"dbspec.gate.{index}",
                                              json.dumps(result.to_tag()))
        self.client.set_model_version_tag(name, version, DECISION_TAG, decision)

    def snapshot(self, name: str) -> RegistrySnapshot:
        """Aliases and tags of ``name`` in one read."""
        model = self._model(name)
        return RegistrySnapshot(name, {a: str(v) for a, v in (model.aliases or {}).items()},
                                dict(model.tags or {}))

    @refusals_said_as("move @{alias} of {name}", "EDIT or MANAGE on the registered model")
    def guarded_move(self, name: str, alias: str,
                     decide: Callable[[RegistrySnapshot], AliasDecision]) -> AliasOutcome:
        """Move ``alias`` where ``decide`` says, atomically with respect to other dbspec writers.

        Under :meth:`lock`: read, ``decide`` (it may raise RegistryError to refuse), append the
        history entry (before the move: a kill cannot leave a move without one), move only if
        the holder is still the one decided on, re-read after; a holder changed in between (a
        writer without the lock) means deciding again. RegistryError: it kept changing.
        """
        from mlflow.exceptions import MlflowException

        with self.lock(name):
            for _ in range(_MOVE_ATTEMPTS):
                seen = self._record_outside_move(self.snapshot(name), alias)
                old = seen.holder(alias)
                decision = decide(seen)
                if decision.version is None or str(decision.version) == old:
                    return AliasOutcome(decision, old, moved=False)
                target = str(decision.version)
                entry = {"version": target, "previous": old, "at": now(),
                         "by": decision.by or acting_user(), "reason": decision.reason}
                seen, key = self._append_history(seen, alias, entry)
                pause_point("promote.before_move")
                if self._holder_version(name, alias) != old:
                    continue  # moved since we decided: decide again on the new holder
                try:
                    self.client.set_registered_model_alias(name, alias, target)
                except MlflowException as exc:
                    if is_permission_denied(exc):
                        raise  # said by refusals_said_as: who may not, and what it needs
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
        """Point ``alias`` at ``version`` (with its history); returns the old holder."""
        return self.guarded_move(name, alias, lambda _: AliasDecision(version, reason)).previous

    def _record_outside_move(self, seen: RegistrySnapshot, alias: str) -> RegistrySnapshot:
        """``seen`` with the outside move it shows for ``alias`` written into the history."""
        move = seen.unrecorded(alias)
        if move is None:
            return seen
        entry = {k: v for k, v in move.items() if k not in ("id", "applied", "recorded")}
        seen, _ = self._append_history(seen, alias, {**entry, "seen_by": acting_user()})
        pause_point("history.after_outside")
        return seen

    def _append_history(self, seen: RegistrySnapshot, alias: str,
                        entry: dict) -> tuple[RegistrySnapshot, str]:
        """One new tag per move, keyed by time (never before the newest entry, whatever the
        clocks say) and a random part, so concurrent writers never overwrite each other;
        ``seen`` with it, and its key."""
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
    def lock(self, name: str) -> Iterator[None]:
        """Exclusive access to ``name``'s aliases among dbspec processes (RegistryError: it
        stayed held). The file lock is beside a SQLite database (every writer excluded), else
        in the user's cache: this machine's writers only (MLflow has no compare-and-set; the
        re-reads of :meth:`guarded_move` catch a change, Databricks' job queues its runs)."""
        # the tracking URI names one lock for every dbspec process configured alike, even with
        # a registry URI apart
        uri, database = self.client.tracking_uri, sqlite_path(self.client.tracking_uri)
        if database is not None:
            path = Path(f"{database}.dbspec-lock")
        else:
            cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
            digest = hashlib.sha256(f"{uri}\n{name}".encode()).hexdigest()[:24]
            path = cache / "dbspec" / "registry-locks" / f"{digest}.lock"
        lock = HostLock(path)
        try:
            lock.acquire(f"the registry lock of {name} ({path})", wait=self.lock_wait_s)
        except LockBusy as busy:
            raise RegistryError(str(busy)) from None
        except OSError as exc:
            raise RegistryError(f"cannot open the registry lock {path}: {exc.strerror}") \
                from None
        try:
            yield
        finally:
            lock.release()

    def versions(self, name: str) -> list[Any]:
        """Every version of ``name``, newest first."""
        self._model(name)
        found = self.client.search_model_versions(f"name = '{name}'")
        return sorted(found, key=lambda v: int(v.version), reverse=True)

    def version(self, name: str, version: str) -> Any:
        """Version ``version`` of ``name`` (RegistryError: none such)."""
        from mlflow.exceptions import MlflowException

        self._model(name)
        try:
            return self.client.get_model_version(name, version)
        except MlflowException as exc:
            if not is_not_found(exc) and \
                    getattr(exc, "error_code", None) != "INVALID_PARAMETER_VALUE":
                raise unavailable(exc, f"{name} v{version}") from None
            raise RegistryError(f"{name} has no version {version}") from None

    def _model(self, name: str) -> Any:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_registered_model(name)
        except MlflowException as exc:
            if not is_not_found(exc):
                raise unavailable(exc, f"registered model '{name}'") from None
            try:
                names = [m.name for m in self.client.search_registered_models()]
            except MlflowException as listing:
                raise unavailable(listing, "the registered models") from None
            from dbspec.errors import did_you_mean

            raise RegistryError(f"no registered model '{name}'{did_you_mean(name, names)}; "
                                f"known: {', '.join(names) or 'none'}") from None


def _undecided(version) -> bool:
    return (version.tags or {}).get(DECISION_TAG) not in DECIDED


def logged_model_id(model_uri: str) -> Optional[str]:
    """The model id of an MLflow 3 logged model URI (``models:/m-...``); None for any other."""
    found = _LOGGED_MODEL_URI.match(model_uri)
    return found["model_id"] if found else None

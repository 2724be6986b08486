"""MLflow model registry: versions, promotion gates, aliases and their history.

- :mod:`.client`: :class:`Registry` (register, gate records, guarded alias moves, the lock);
  :mod:`.pending`: pending versions of dead processes, tagged abandoned.
- :mod:`.aliases`: :func:`alias_holder`, the one lookup of an alias's holder.
- :mod:`.promotion`: the promotion service (``run``'s promote stage, ``promote``, ``approve``,
  ``rollback``): a typed :class:`~.candidate.Candidate` in, gate results and a
  :class:`~.gating.Decision` out; gates are evaluated by the kinds of
  :data:`dbspec.seams.gates.GATES` (:mod:`.gating`), rollbacks decided in :mod:`.rollback`.
- :mod:`.lifecycle`: staged promotion's records (stages, approvals, archived versions) and the
  lifecycle state read back from them.
- :mod:`.history`: the alias history kept in tags, read as :class:`RegistrySnapshot`.
- :mod:`.locks`, :mod:`.errors`, and :mod:`.commands` (``dbspec models``).

Importing this package imports no MLflow: each function imports it when it talks to a store.
"""

from dbspec.registry.aliases import alias_holder
from dbspec.registry.client import (
    DECIDED,
    GATES_TAG,
    RUN_TAG,
    UNGATED,
    AliasDecision,
    AliasOutcome,
    RegisteredVersion,
    Registry,
    logged_model_id,
)
from dbspec.registry.errors import RegistryError, RegistryUnavailable
from dbspec.registry.pending import (
    ABANDONED,
    ABANDONED_TAG,
    DECISION_TAG,
    OWNER_TAG,
    PENDING,
    PENDING_GRACE_S,
)
from dbspec.registry.history import HISTORY_TAG, OUTSIDE_BY, RegistrySnapshot
from dbspec.seams.gates import GateResult

__all__ = [
    "ABANDONED", "ABANDONED_TAG", "DECIDED", "DECISION_TAG", "GATES_TAG", "HISTORY_TAG",
    "OUTSIDE_BY", "OWNER_TAG", "PENDING", "PENDING_GRACE_S", "RUN_TAG", "UNGATED",
    "AliasDecision", "AliasOutcome", "GateResult", "RegisteredVersion", "Registry",
    "RegistryError", "RegistrySnapshot", "RegistryUnavailable", "alias_holder",
    "logged_model_id",
]

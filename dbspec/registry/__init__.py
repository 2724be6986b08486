"""MLflow model registry: versions, promotion gates, aliases and their history.

- :mod:`.client`: :class:`Registry` (register, gate records, guarded alias moves, the lock).
- :mod:`.aliases`: :func:`alias_holder`, the one lookup of an alias's holder.
- :mod:`.gates`: :func:`check_gates`, :class:`GateResult` and :class:`Champion` (what a
  ``better_than`` gate compares with); diagnosis gates.
- :mod:`.lifecycle`: staged promotion's records (stages, approvals, archived versions) and the
  lifecycle state read back from them.
- :mod:`.history`: the alias history kept in tags, read as :class:`RegistrySnapshot`.
- :mod:`.locks`, :mod:`.errors`, and :mod:`.commands` (``dbspec models/promote/approve/
  rollback``).

Importing this package imports no MLflow: each function imports it when it talks to a store.
"""

from dbspec.registry.aliases import alias_holder
from dbspec.registry.client import (
    ABANDONED,
    ABANDONED_TAG,
    DECIDED,
    DECISION_TAG,
    GATES_TAG,
    OWNER_TAG,
    PENDING,
    PENDING_GRACE_S,
    RUN_TAG,
    UNGATED,
    AliasDecision,
    AliasOutcome,
    RegisteredVersion,
    Registry,
    logged_model_id,
)
from dbspec.registry.errors import RegistryError, RegistryUnavailable
from dbspec.registry.gates import GateResult, check_gates
from dbspec.registry.history import HISTORY_TAG, OUTSIDE_BY, RegistrySnapshot

__all__ = [
    "ABANDONED", "ABANDONED_TAG", "DECIDED", "DECISION_TAG", "GATES_TAG", "HISTORY_TAG",
    "OUTSIDE_BY", "OWNER_TAG", "PENDING", "PENDING_GRACE_S", "RUN_TAG", "UNGATED",
    "AliasDecision", "AliasOutcome", "GateResult", "RegisteredVersion", "Registry",
    "RegistryError", "RegistrySnapshot", "RegistryUnavailable", "alias_holder", "check_gates",
    "logged_model_id",
]

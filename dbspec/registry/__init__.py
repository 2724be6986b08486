"""MLflow model registry: versions, promotion gates, aliases and their history.

:mod:`.client` holds :class:`Registry`; :mod:`.promotion` is the promotion service (``run``'s
promote stage, ``promote``, ``approve``, ``rollback``); :mod:`.lifecycle` and :mod:`.history`
read back the records kept in tags. Importing this package imports no MLflow.
"""

from dbspec.registry.aliases import alias_holder
from dbspec.registry.client import GATES_TAG, UNGATED, AliasDecision, Registry
from dbspec.registry.errors import RegistryError, RegistryUnavailable
from dbspec.registry.pending import DECISION_TAG, PENDING

__all__ = ["DECISION_TAG", "GATES_TAG", "PENDING", "UNGATED", "AliasDecision", "Registry",
           "RegistryError", "RegistryUnavailable", "alias_holder"]

"""``compute``: where training runs, selected by ``kind``: one member per compute kind, built-in
(``dbspec/compute/``) or from an installed plugin (see :mod:`dbspec.seams.compute`)."""

from typing import TYPE_CHECKING, Any

from dbspec.seams.compute import COMPUTE
from dbspec.spec.kinds import kind_union

if TYPE_CHECKING:  # the members are known only at run time (installed plugins)
    Compute = Any
else:
    Compute = kind_union(COMPUTE)

"""``compute``: where training runs, selected by ``kind``: one member per compute kind, built-in
(``dbspec/compute/``) or from an installed plugin (see :mod:`dbspec.seams.compute`)."""

from dbspec.seams.compute import COMPUTE
from dbspec.spec.kinds import kind_union

Compute = kind_union(COMPUTE)

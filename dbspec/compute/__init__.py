"""Compute kinds: one module per compute.kind (see dbspec.seams.compute).

The spec models are imported first: they build the ``compute`` union from the registry, which
imports these modules; a kind module imported on its own (a test) would otherwise be half
loaded when the union asks for it.
"""

import dbspec.spec.sections  # noqa: F401  (see above)

__all__: list[str] = []

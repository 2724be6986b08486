"""Data sources: one module per data.source kind (see dbspec.seams.sources).

The spec models are imported first: they build the ``data.source`` union from the registry,
which imports these modules; a kind module imported alone would be half loaded when asked.
"""

import dbspec.spec.sections  # noqa: F401  (see above)

__all__: list[str] = []

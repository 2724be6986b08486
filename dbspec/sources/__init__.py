"""Data sources: one module per data.source kind (see dbspec.seams.sources)."""

"""Serving targets: one module per place a model is served (see dbspec.seams.targets)."""

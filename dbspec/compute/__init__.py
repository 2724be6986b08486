"""Compute kinds: one module per compute.kind (see dbspec.seams.compute)."""

"""Promotion gates: one module per gate kind (see dbspec.seams.gates)."""

"""Networks from the spec, and the served model that wraps them (torch imported here)."""

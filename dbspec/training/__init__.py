"""Training: the loop, its components and checkpoints (torch imported here)."""

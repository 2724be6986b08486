"""Executors run a plan's stages: ``LocalExecutor`` in this process."""

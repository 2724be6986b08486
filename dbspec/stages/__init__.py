"""One small module per stage kind; :func:`~dbspec.stages.build.build_stage` maps a planned
stage to its implementation."""

from dbspec.stages.build import build_stage

__all__ = ["build_stage"]

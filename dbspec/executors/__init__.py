"""Executors run a plan's stages: :mod:`.local` in this process, :mod:`.spark` with one Spark
session around the run. Stage state is :mod:`.state` and :mod:`.cache`.

The executors are re-exported lazily: ``dbspec plan`` and ``dbspec gc`` import :mod:`.cache`
and should not pay for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dbspec.executors.local import LocalExecutor, StageFailed
    from dbspec.executors.records import RunRecord, StageRecord
    from dbspec.executors.spark import SparkExecutor

_EXPORTS = {"LocalExecutor": "local", "RunRecord": "records", "StageFailed": "local",
            "StageRecord": "records", "SparkExecutor": "spark"}

__all__ = ["LocalExecutor", "RunRecord", "SparkExecutor", "StageFailed", "StageRecord"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dbspec.executors' has no attribute '{name}'")
    from importlib import import_module

    return getattr(import_module(f"dbspec.executors.{_EXPORTS[name]}"), name)

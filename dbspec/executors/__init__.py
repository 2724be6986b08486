"""Executors run a plan's stages: one module per executor.

- :class:`~dbspec.executors.local.LocalExecutor` (:mod:`.local`): stages in this process.
- :class:`~dbspec.executors.spark.SparkExecutor` (:mod:`.spark`): the same, with one Spark
  session around the run.

Stage state between invocations is :mod:`.state` (on disk, or in an MLflow run) and
:mod:`.cache`; the end-of-run summary :mod:`.summary`. The executors are re-exported lazily:
``dbspec plan`` and ``dbspec gc`` import :mod:`.cache` and should not pay for them.
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

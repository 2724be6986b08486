"""Spec -> DAG of stages. Pure: no I/O, no heavy imports."""

from dbspec.plan.compile import Plan, PlannedStage, compile_plan

__all__ = ["Plan", "PlannedStage", "compile_plan"]

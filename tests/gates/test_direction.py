"""Metric direction is decided in one place (dbspec.spec.metrics), and everyone asks it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dbspec.spec.metrics import at_least_as_good, lower_is_better, no_worse_sign

PACKAGE = Path(__file__).resolve().parents[2] / "dbspec"


@pytest.mark.parametrize("metric, lower", [
    ("val_loss", True), ("test_rmse", True), ("test_mae", True), ("test_mse", True),
    ("test_mape", True), ("val_log_loss", True), ("test_accuracy", False), ("test_r2", False),
    ("val_roc_auc", False), ("test_f1", False),
])
def test_direction_from_the_metric_name(metric, lower):
    assert lower_is_better(metric) is lower
    assert no_worse_sign(metric) == ("<=" if lower else ">=")


def test_at_least_as_good_follows_the_direction_and_tolerance():
    assert at_least_as_good("test_rmse", 1.0, 2.0) and not at_least_as_good("test_rmse", 2.5, 2.0)
    assert at_least_as_good("test_rmse", 2.5, 2.0, tolerance=0.5)
    assert at_least_as_good("test_r2", 0.9, 0.8) and not at_least_as_good("test_r2", 0.7, 0.8)
    assert at_least_as_good("test_r2", 0.7, 0.8, tolerance=0.1 + 1e-12)


def test_no_other_module_keeps_a_list_of_lower_is_better_metrics():
    """The suffix list ("rmse", "mae", ...) lives only in dbspec/spec/metrics.py."""
    holders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Tuple) and {"rmse", "mae"} <= {
                    getattr(e, "value", None) for e in node.elts}:
                holders.append(path.relative_to(PACKAGE).as_posix())
    # spec/sections/lifecycle.py names the metrics a task computes (no direction in it)
    assert sorted(set(holders) - {"spec/sections/lifecycle.py"}) == ["spec/metrics.py"]


def test_the_scaffold_says_the_direction_of_its_gate_metric():
    from dbspec.scaffold import Scaffold, render

    def scaffold(task: str) -> Scaffold:
        return Scaffold(source={"kind": "csv", "path": "x.csv"}, target="y", task=task,
                        features=["a", "b"], skipped=[], classes=2, impute=False, rows=10)

    assert "# test_roc_auc >= @production" in render(scaffold("binary"), name="s")
    assert "# test_rmse <= @production" in render(scaffold("regression"), name="s")

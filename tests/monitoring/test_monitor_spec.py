"""The monitoring: section: defaults, located errors, and the --since forms."""

from __future__ import annotations

import pytest

from dbspec.errors import UsageError
from tests.conftest import run_in_process

BASE = """\
name: monitored
data: {source: {kind: sklearn, name: diabetes}, task: regression}
model: {layers: [{linear: {out: 1}}]}
"""
REGISTRY = "registry: {name: m, promotion: {alias: production}}\n"
TABLE = "serving: {realtime: {inference_table: {path: /data/t}}}\n"


def test_a_full_section_validates_and_keeps_its_defaults(write_spec):
    from dbspec.spec.loader import load_spec

    spec = load_spec(write_spec(BASE + REGISTRY + TABLE + "monitoring: {on_alert: rollback}\n")
                     ).spec
    assert spec.monitoring.window == "1h" and spec.monitoring.min_rows == 100
    assert spec.monitoring.thresholds.psi == 0.2 and spec.monitoring.thresholds.ks == 0.1
    from dbspec.spec.sections.monitoring import default_alias

    assert default_alias(spec) == "production"


@pytest.mark.parametrize("extra, where, message", [
    (REGISTRY + TABLE + "monitoring: {window: 90 minutes}\n", ":6:22: monitoring.window",
     "'90 minutes' is not a duration"),
    (REGISTRY + TABLE + "monitoring: {lookback: ever}\n", "monitoring.lookback",
     "'ever' is not a duration"),
    (REGISTRY + TABLE + "monitoring: {thresholds: {psi: 0}}\n", "monitoring.thresholds.psi",
     "greater than 0"),
    (REGISTRY + TABLE + "monitoring: {tresholds: {}}\n", "monitoring.tresholds", ""),
    (REGISTRY + "monitoring: {window: 1h}\n", "monitoring.table",
     "no inference table to monitor"),
    (TABLE + "monitoring: {window: 1h}\n", ":5:13: monitoring:", "add a registry section"),
    ("registry: {name: m}\n" + TABLE + "monitoring: {on_alert: rollback}\n",
     "monitoring.on_alert", "rollback moves an alias back, and this spec names none"),
    (REGISTRY + TABLE + "monitoring: {checks: [drift]}\n", "monitoring.checks.0", "features"),
])
def test_mistakes_in_the_section_are_located(write_spec, extra, where, message):
    result = run_in_process("validate", write_spec(BASE + extra))
    assert result.returncode == 1, result.stdout + result.stderr
    assert where in result.stdout and message in result.stdout, result.stdout


def test_since_takes_an_iso_time_or_a_duration_ago():
    from dbspec.monitoring.use_case import parse_since

    assert parse_since("2026-01-01T00:00:00Z") == 1_767_225_600.0
    assert parse_since("2026-01-01T01:00:00+01:00") == 1_767_225_600.0
    assert parse_since("2026-01-01") == 1_767_225_600.0  # no zone: UTC
    assert parse_since("90m", now=10_000.0) == 10_000.0 - 5400
    with pytest.raises(UsageError, match="expected an ISO time"):
        parse_since("last tuesday")

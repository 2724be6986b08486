"""The ``monitoring:`` section: what ``dbspec monitor`` checks in the inference table, when it
alerts, and what it does then."""

import re
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator

from dbspec.spec.sections.base import SpecModel, d, section

CHECKS = ("features", "predictions", "missing", "out_of_range", "quality")
_DURATION = re.compile(r"^(\d+)(s|m|h|d)$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: A catalog table's name (``schema.table``, ``catalog.schema.table``) rather than a path.
CATALOG_TABLE = re.compile(r"^[A-Za-z_`][\w`-]*(\.[A-Za-z_`][\w`-]*){1,2}$")


def duration_seconds(text: str) -> int:
    """Seconds in a duration such as ``90s``, ``15m``, ``1h`` or ``7d``.

    Raises:
        ValueError: anything else, or zero.
    """
    found = _DURATION.match(text.strip()) if isinstance(text, str) else None
    if not found or int(found[1]) == 0:
        raise ValueError(f"'{text}' is not a duration: write a positive number with s, m, h or "
                         "d, such as 15m, 1h or 7d")
    return int(found[1]) * _SECONDS[found[2]]


def _duration(text: str) -> str:
    duration_seconds(text)
    return text


Duration = Annotated[str, AfterValidator(_duration)]


class ThresholdsSpec(SpecModel):
    """When a window counts as drifted. A feature or output drifts when its PSI (or KS
    statistic) passes the threshold *and* the difference is significant at ``p_value``."""

    psi: float = d("Population stability index over the reference's 10 quantile bins "
                   "(0.1: a moderate shift, 0.2: a large one).", default=0.2, gt=0)
    ks: float = d("Two-sample Kolmogorov-Smirnov statistic (largest gap between the CDFs).",
                  default=0.1, gt=0, le=1)
    p_value: float = d("Significance a PSI (chi-square) or KS difference must also reach: on "
                       "small windows the statistics are noisy.", default=0.001, gt=0, le=1)
    missing: float = d("Share of missing values above the training share.", default=0.05,
                       ge=0, le=1)
    out_of_range: float = d("Share of values outside the training minimum-maximum (for a "
                            "discrete column: values never seen in training).", default=0.05,
                            ge=0, le=1)
    quality_drop: float = d("With labels: how much worse than the version's registered test "
                            "metric a window may be, as a share of it (0.1: 10% worse).",
                            default=0.1, gt=0)


class LabelsSpec(SpecModel):
    """Ground truth that arrives after the predictions, joined to the inference table."""

    path: Optional[str] = d("Delta, Parquet or CSV path of the labels; --labels overrides it.",
                            default=None, min_length=1)
    key: str = d("Column joining labels to served rows: request_id, or a column both hold. "
                 "A request of several rows needs a 'row' column too (0-based position in "
                 "the request).", default="request_id", min_length=1)
    column: Optional[str] = d("The label column; default: data.target.", default=None,
                              min_length=1)


class MonitoringSpec(SpecModel):
    """Drift and quality monitoring of the served model: ``dbspec monitor``."""

    table: Optional[str] = d("The inference table (Delta); default: "
                             "serving.realtime.inference_table.path.", default=None,
                             min_length=1)
    window: Duration = d("Length of one window, such as 15m, 1h or 1d; windows start on multiples "
                    "of it (UTC).", default="1h")
    lookback: Optional[Duration] = d("How far back a pass reads when --since is not given, such as "
                                "2h for an hourly job (a pass then alerts on recent windows "
                                "only); default: the whole table.", default=None)
    min_rows: int = d("Windows with fewer rows are reported, not checked.", default=100, ge=1)
    checks: list[Literal["features", "predictions", "missing", "out_of_range", "quality"]] = d(
        "Which findings raise an alert: feature drift, prediction drift, missing values, "
        "out-of-range values, a quality drop (needs labels).", default=list(CHECKS))
    thresholds: ThresholdsSpec = section("When a window counts as drifted.")
    labels: Optional[LabelsSpec] = d("Labels for the quality metrics.", default=None)
    on_alert: Literal["none", "tag", "rollback"] = d(
        "On an alert: only exit 3; tag the version (dbspec.monitoring.alert); or also move the "
        "alias back to its previous holder (only when the alerting version holds it).",
        default="none")
    retrain: bool = d("On Databricks: when a pass of the monitor job alerts, start the training "
                      "job, whose new version goes through the deployment job's gates and "
                      "approval (a failed pass starts nothing).", default=False)
    alias: Optional[str] = d("Alias the actions act on; default: serving.model_alias, else the "
                             "(last) promotion alias.", default=None,
                             pattern=r"^[A-Za-z][A-Za-z0-9_\-]*$")
    experiment: Optional[str] = d("MLflow experiment of the monitoring runs; default: "
                                  "<registered name>-monitoring.", default=None, min_length=1)


def default_alias(spec: Any) -> Optional[str]:
    """The alias monitoring acts on: its own, ``serving.model_alias``, else the last promotion
    stage's alias."""
    if spec.monitoring is not None and spec.monitoring.alias:
        return spec.monitoring.alias
    if spec.serving.model_alias:
        return spec.serving.model_alias
    return spec.registry.final_alias() if spec.registry is not None else None


def check_monitoring(spec: Any) -> list[tuple[tuple, str]]:
    """Findings across sections: (dotted path, message) for each."""
    monitoring = spec.monitoring
    if monitoring is None:
        return []
    found: list[tuple[tuple, str]] = []
    if spec.registry is None:
        found.append((("monitoring",), "monitoring reads the reference profile of a registered "
                      "model version; add a registry section with a name"))
    table = spec.serving.realtime.inference_table
    if monitoring.table is None and (table is None or not table.enabled):
        found.append((("monitoring", "table"), "no inference table to monitor: set "
                      "serving.realtime.inference_table (path) or monitoring.table"))
    if monitoring.on_alert == "rollback" and spec.registry is not None and \
            default_alias(spec) is None:
        found.append((("monitoring", "on_alert"), "rollback moves an alias back, and this spec "
                      "names none: set monitoring.alias, serving.model_alias or "
                      "registry.promotion"))
    return found

"""What a trial produces: its record for progress lines and the summary, its value, its failure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from dbspec.errors import DbspecError


class TrialFailed(DbspecError):
    """A trial could not produce a value (invalid suggestion, NaN loss, a crash)."""


@dataclass
class TrialRecord:
    """What one trial did, for progress lines and the study summary."""

    number: int
    state: str
    value: Optional[float]
    params: dict[str, Any]
    epochs: int
    seconds: float
    error: str = ""

    def describe(self) -> str:
        """One progress line: number, state, value, epochs, parameters, error."""
        shown = "-" if self.value is None else f"{self.value:.6g}"
        params = ", ".join(f"{k}={_short(v)}" for k, v in self.params.items())
        error = f"  ({self.error})" if self.error else ""
        return (f"trial {self.number:>3}  {self.state:<8} value {shown:<10} "
                f"{self.epochs:>3} epochs  {params}{error}")


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def best_value_of(history: list[dict[str, float]], metric: str, best_epoch: int,
                  restored: bool) -> float:
    """The metric of the model a trial ends with (the restored best epoch, or the last)."""
    row = history[best_epoch] if restored and 0 <= best_epoch < len(history) else history[-1]
    if metric not in row:
        raise TrialFailed(f"search.metric '{metric}' was not logged by the trial")
    return float(row[metric])


#: Called with each finished trial's record (progress lines, worker output).
ReportFn = Callable[[TrialRecord], None]

"""Reading a run's learning curves, as a person reads the loss plot: overfitting (validation
stalled or rose while training kept falling, or a wide final gap), underfitting (training ends
near the loss of an input-blind model), converged (both fell and end close), or undetermined.

Each threshold below is relative to the losses' own scale, so one rule fits a standardised MSE
and a cross-entropy alike (docs/howto/watch-training.md has them as a table).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

OVERFITTING, UNDERFITTING, CONVERGED, UNDETERMINED = (
    "overfitting", "underfitting", "converged", "undetermined")
LABELS = (OVERFITTING, UNDERFITTING, CONVERGED, UNDETERMINED)
#: The run and model-version tag holding a run's label; the detail tag holds its reason.
DIAGNOSIS_TAG = "dbspec.diagnosis"
DIAGNOSIS_DETAIL_TAG = "dbspec.diagnosis.detail"

MIN_EPOCHS = 3  # with both losses; two points make no curve
# Overfitting: after the best validation epoch the training loss fell by this share while the
# validation loss rose by VALIDATION_ROSE, or stalled for STALLED_EPOCHS (a wobble is not it)...
TRAIN_KEEPS_FALLING = 0.05
VALIDATION_ROSE = 0.02
STALLED_EPOCHS = 2
# ...or validation ends above training by this share of it (dropout's reverse gap is no gap)
GAP_SHARE = 0.35
UNDERFIT_SHARE = 0.8  # final training and best validation loss, of the baseline's loss
CLOSE_SHARE = 0.2  # converged: final losses this close, as a share of the validation loss
STILL_IMPROVING = 0.01  # noted when the last epoch beat the best validation by this share


@dataclass(frozen=True)
class CurveDiagnosis:
    """What the learning curves of one run show."""

    label: str  # one of LABELS
    reason: str  # the evidence, with the numbers it rests on
    best_epoch: Optional[int] = None  # 1-based, as :func:`best_epoch`
    epochs: int = 0
    baseline_loss: Optional[float] = None  # the input-blind model's, for underfitting
    notes: tuple[str, ...] = ()  # observations that change no label

    def text(self) -> str:
        """``overfitting: validation loss ... (best epoch 2)``."""
        extra = "".join(f"; {note}" for note in self.notes)
        return f"{self.label}: {self.reason}{extra}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "notes": list(self.notes)}


def best_epoch(history: Sequence[dict[str, float]]) -> Optional[int]:
    """The 1-based epoch with the lowest validation loss (else training loss); None if none."""
    for key in ("val_loss", "train_loss"):
        indexed = [(float(h[key]), i) for i, h in enumerate(history) if _finite(h.get(key))]
        if indexed:
            return min(indexed)[1] + 1
    return None


def diagnose_curves(history: Sequence[dict[str, float]], baseline_loss: Optional[float] = None,
                    *, kept_epoch: Optional[int] = None) -> CurveDiagnosis:
    """Diagnose a run from its per-epoch ``train_loss`` and ``val_loss``.

    Args:
        history: One dict per epoch, as training records it.
        baseline_loss: The training loss of a model that ignores its inputs (the evaluate stage
            computes it on the training split); without it underfitting is not diagnosed.
        kept_epoch: The 1-based epoch whose weights the model has, when early stopping restored
            its best epoch: an overfitting run then says the model kept predates the rise. The
            label stays: the curves show what they show.
    """
    epochs = [h for h in history
              if _finite(h.get("train_loss")) and _finite(h.get("val_loss"))]
    best = best_epoch(history)
    common = {"best_epoch": best, "epochs": len(history), "baseline_loss": baseline_loss}
    if len(epochs) < MIN_EPOCHS:
        missing = "no validation loss (no validation split)" if not any(
            _finite(h.get("val_loss")) for h in history) else \
            f"{len(epochs)} epoch(s) with both losses, {MIN_EPOCHS} needed"
        return CurveDiagnosis(UNDETERMINED, missing, **common)
    train = [float(h["train_loss"]) for h in epochs]
    val = [float(h["val_loss"]) for h in epochs]
    at = min(range(len(val)), key=val.__getitem__)  # best validation epoch among these
    notes = _notes(val)
    overfit = _overfitting(train, val, at)
    if overfit:
        if kept_epoch is not None and kept_epoch == best and best < len(history):
            notes += (f"the model kept is epoch {kept_epoch}'s (early stopping restored the best "
                      "validation epoch)",)
        return CurveDiagnosis(OVERFITTING, overfit, notes=notes, **common)
    underfit = _underfitting(train, val, baseline_loss)
    if underfit:
        return CurveDiagnosis(UNDERFITTING, underfit, notes=notes, **common)
    close = abs(val[-1] - train[-1]) <= CLOSE_SHARE * abs(val[-1])
    moves = (f"training {train[0]:.4g} -> {train[-1]:.4g}, validation {val[0]:.4g} -> "
             f"{val[-1]:.4g}")
    if not (train[-1] < train[0] and min(val) < val[0]):
        label, reason = UNDETERMINED, f"the losses did not both fall ({moves})"
    elif close:
        label, reason = CONVERGED, f"both losses fell ({moves}) and end close"
    else:
        label, reason = UNDETERMINED, (f"both losses fell but end apart (training "
                                       f"{train[-1]:.4g}, validation {val[-1]:.4g})")
    return CurveDiagnosis(label, reason, notes=notes, **common)


def _overfitting(train: list[float], val: list[float], at: int) -> str:
    """Why the curves show overfitting, or an empty string."""
    after = len(val) - 1 - at
    scale = abs(val[at]) or 1.0
    if after >= 1:
        dropped = (train[at] - train[-1]) / (abs(train[at]) or 1.0)
        rose = (val[-1] - val[at]) / scale
        if dropped >= TRAIN_KEEPS_FALLING and (rose >= VALIDATION_ROSE
                                               or after >= STALLED_EPOCHS):
            how = f"rose {rose:.0%} from its best" if rose >= VALIDATION_ROSE else \
                f"did not improve for {after} epochs"
            return (f"validation loss {how} ({val[at]:.4g} at epoch {at + 1} -> {val[-1]:.4g}) "
                    f"while training loss kept falling ({train[at]:.4g} -> {train[-1]:.4g}, "
                    f"-{dropped:.0%})")
    gap = val[-1] - train[-1]
    if gap > GAP_SHARE * abs(val[-1]):
        return (f"validation loss ends at {val[-1]:.4g}, {val[-1] / train[-1]:.2g}x the training "
                f"loss {train[-1]:.4g} (a gap over {GAP_SHARE:.0%} of the validation loss)") \
            if train[-1] > 0 else (f"validation loss ends at {val[-1]:.4g} against a training "
                                   f"loss of {train[-1]:.4g}")
    return ""


def _underfitting(train: list[float], val: list[float], baseline: Optional[float]) -> str:
    """Why the curves show underfitting, or an empty string."""
    if baseline is None or not math.isfinite(baseline) or baseline <= 0:
        return ""
    train_share, val_share = train[-1] / baseline, min(val) / baseline
    if train_share >= UNDERFIT_SHARE and val_share >= UNDERFIT_SHARE:
        return (f"training loss ends at {train[-1]:.4g} and validation loss is at best "
                f"{min(val):.4g}: {train_share:.0%} and {val_share:.0%} of the {baseline:.4g} of "
                "a model that ignores its inputs")
    return ""


def _notes(val: list[float]) -> tuple[str, ...]:
    # a new best: a last epoch that only falls back toward an earlier best is no improvement
    best_before = min(val[:-1], default=math.inf)
    if best_before - val[-1] >= STILL_IMPROVING * abs(best_before):
        return ("validation loss still improving at the last epoch: more epochs may help",)
    return ()


def _finite(value: Any) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False

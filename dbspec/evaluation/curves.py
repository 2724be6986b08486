"""Reading a run's learning curves: overfitting, underfitting or good convergence.

The per-epoch training and validation losses of a run say how its fit went, the way a person
reads the loss-curve plot:

- *overfitting*: the validation loss stopped improving, or rose, while the training loss kept
  falling; or, at the end, the validation loss is far above the training loss.
- *underfitting*: the training loss ends close to the loss of a model that ignores its inputs
  (always the training mean for a regression, always the class frequencies for a classifier):
  the network learnt little of what there was to learn.
- *converged*: both fell, and they end close to each other.
- *undetermined*: too few epochs, or no validation loss, to say.

Each threshold is a named constant below, relative to the losses' own scale (a share of the best
validation loss, or of the baseline's loss), so one rule fits a regression's standardised MSE and
a classifier's cross-entropy alike. README ("Learning curves") has them as a table. Everything
here is a pure function of recorded series, tested on each shape.
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

# Fewer epochs with both losses than this, and nothing is said: two points make no curve.
MIN_EPOCHS = 3
# Overfitting, first sign: after the best validation epoch the training loss fell by at least
# this share of its value there...
TRAIN_KEEPS_FALLING = 0.05
# ...while the validation loss ended at least this share above its best (it rose), or did not
# improve for at least STALLED_EPOCHS epochs. A validation loss that wobbles within the share
# while training barely moves is not overfitting.
VALIDATION_ROSE = 0.02
STALLED_EPOCHS = 2
# Overfitting, second sign: the final validation loss exceeds the final training loss by more
# than this share of the validation loss (a generalisation gap; dropout makes the training loss
# the higher one, which is never a gap).
GAP_SHARE = 0.35
# Underfitting: the final training loss is at least this share of the baseline's loss, and so is
# the best validation loss (both stay high).
UNDERFIT_SHARE = 0.8
# Converged: the final losses are within this share of the validation loss of each other.
CLOSE_SHARE = 0.2
# "Still improving" is noted when the last epoch improved the validation loss by this share.
STILL_IMPROVING = 0.01


@dataclass(frozen=True)
class CurveDiagnosis:
    """What the learning curves of one run show.

    Attributes:
        label: One of :data:`LABELS`.
        reason: The evidence, in words, with the numbers it rests on.
        best_epoch: The epoch (1-based) of the lowest validation loss (training loss without a
            validation split); None without any loss.
        epochs: Epochs recorded.
        baseline_loss: The loss of the input-blind model the underfitting rule compares with.
        notes: Further observations that change no label ("still improving at the last
            epoch").
    """

    label: str
    reason: str
    best_epoch: Optional[int] = None
    epochs: int = 0
    baseline_loss: Optional[float] = None
    notes: tuple[str, ...] = ()

    def text(self) -> str:
        """``overfitting: validation loss ... (best epoch 2)``."""
        extra = "".join(f"; {note}" for note in self.notes)
        return f"{self.label}: {self.reason}{extra}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "notes": list(self.notes)}


def loss_series(history: Sequence[dict[str, float]], key: str) -> list[float]:
    """The finite values of ``key`` in ``history``, in epoch order (missing epochs skipped)."""
    values = []
    for epoch in history:
        value = epoch.get(key)
        if value is not None and math.isfinite(float(value)):
            values.append(float(value))
    return values


def best_epoch(history: Sequence[dict[str, float]]) -> Optional[int]:
    """The 1-based epoch with the lowest validation loss (else training loss); None if none."""
    for key in ("val_loss", "train_loss"):
        indexed = [(float(h[key]), i) for i, h in enumerate(history)
                   if h.get(key) is not None and math.isfinite(float(h[key]))]
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
    gap = val[-1] - train[-1]
    close = abs(gap) <= CLOSE_SHARE * abs(val[-1])
    fell = train[-1] < train[0] and min(val) < val[0]
    if fell and close:
        return CurveDiagnosis(CONVERGED, f"both losses fell (training {train[0]:.4g} -> "
                                         f"{train[-1]:.4g}, validation {val[0]:.4g} -> "
                                         f"{val[-1]:.4g}) and end close", notes=notes, **common)
    if not fell:
        return CurveDiagnosis(UNDETERMINED, f"the losses did not both fall (training "
                                            f"{train[0]:.4g} -> {train[-1]:.4g}, validation "
                                            f"{val[0]:.4g} -> {val[-1]:.4g})", notes=notes,
                              **common)
    return CurveDiagnosis(UNDETERMINED, f"both losses fell but end apart (training "
                                        f"{train[-1]:.4g}, validation {val[-1]:.4g})",
                          notes=notes, **common)


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
    if len(val) >= 2 and val[-2] - val[-1] >= STILL_IMPROVING * abs(val[-2]):
        return ("validation loss still improving at the last epoch: more epochs may help",)
    return ()


def _finite(value: Any) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False

"""Learning-curve diagnosis: each shape of curve, on recorded series."""

import pytest

from dbspec.evaluation.curves import (CONVERGED, OVERFITTING, UNDERFITTING, UNDETERMINED,
                                      best_epoch, diagnose_curves)


def _history(train, val):
    return [{"train_loss": t, **({"val_loss": v} if v is not None else {})}
            for t, v in zip(train, val)]


def test_validation_flat_while_training_falls_is_overfitting():
    # the run: train 0.42 -> 0.19, validation flat at ~0.27 from epoch 2
    found = diagnose_curves(_history([0.42, 0.31, 0.27, 0.24, 0.21, 0.19],
                                     [0.30, 0.268, 0.270, 0.271, 0.269, 0.272]), 0.69)
    assert found.label == OVERFITTING
    assert found.best_epoch == 2
    assert "did not improve for 4 epochs" in found.reason and "0.42" not in found.reason


def test_a_last_epoch_that_falls_back_toward_the_best_is_not_still_improving():
    # it said both "did not improve for 10 epochs" and "still improving at the last epoch"
    val = [0.5, 0.30] + [0.302 + 0.001 * i for i in range(9)] + [0.305]
    found = diagnose_curves(_history([0.6 - 0.04 * i for i in range(12)], val))
    assert found.label == OVERFITTING and "did not improve for 10 epochs" in found.reason
    assert found.notes == ()


def test_validation_rising_while_training_falls_is_overfitting():
    found = diagnose_curves(_history([1.0, 0.8, 0.6, 0.5], [1.0, 0.85, 0.9, 0.95]))
    assert found.label == OVERFITTING and "rose" in found.reason


def test_a_wide_final_gap_is_overfitting_even_while_validation_improves():
    found = diagnose_curves(_history([0.5, 0.2, 0.1, 0.05], [0.9, 0.8, 0.75, 0.7]))
    assert found.label == OVERFITTING and "14x" in found.reason


def test_both_high_against_the_baseline_is_underfitting():
    found = diagnose_curves(_history([1.02, 0.99, 0.97, 0.96], [1.01, 0.99, 0.98, 0.975]), 1.0)
    assert found.label == UNDERFITTING and "96%" in found.reason


def test_without_a_baseline_high_losses_are_not_called_underfitting():
    found = diagnose_curves(_history([1.02, 0.99, 0.97, 0.96], [1.01, 0.99, 0.98, 0.975]))
    assert found.label == CONVERGED


def test_both_falling_and_ending_close_is_convergence():
    found = diagnose_curves(_history([0.9, 0.5, 0.35, 0.30, 0.29], [0.85, 0.5, 0.37, 0.33, 0.32]),
                            1.0)
    assert found.label == CONVERGED and found.best_epoch == 5
    assert found.notes == ("validation loss still improving at the last epoch: more epochs may "
                           "help",)


def test_dropout_makes_training_loss_the_higher_one_which_is_no_gap():
    found = diagnose_curves(_history([0.9, 0.6, 0.5, 0.45], [0.7, 0.45, 0.40, 0.39]), 1.0)
    assert found.label == CONVERGED


@pytest.mark.parametrize("history, why", [
    (_history([0.5, 0.4], [0.5, 0.45]), "2 epoch(s) with both losses, 3 needed"),
    (_history([0.5, 0.4, 0.3], [None, None, None]), "no validation loss"),
    ([], "no validation loss"),
])
def test_too_little_to_read_is_undetermined(history, why):
    found = diagnose_curves(history, 1.0)
    assert found.label == UNDETERMINED and why in found.reason


def test_losses_that_did_not_fall_are_undetermined():
    found = diagnose_curves(_history([0.3, 0.3, 0.31], [0.3, 0.3, 0.3]))
    assert found.label == UNDETERMINED and "did not both fall" in found.reason


def test_non_finite_epochs_are_skipped():
    found = diagnose_curves(_history([0.9, float("nan"), 0.5, 0.35, 0.30],
                                     [0.85, 0.6, 0.5, 0.37, 0.32]), 1.0)
    assert found.label == CONVERGED and found.epochs == 5


def test_best_epoch_falls_back_to_the_training_loss():
    assert best_epoch(_history([0.5, 0.3, 0.4], [None, None, None])) == 2
    assert best_epoch([]) is None


def test_the_diagnosis_round_trips_as_json():
    found = diagnose_curves(_history([1.0, 0.8, 0.6, 0.5], [1.0, 0.85, 0.9, 0.95]), 2.0)
    data = found.to_json()
    assert data["label"] == OVERFITTING and data["baseline_loss"] == 2.0
    assert found.text().startswith("overfitting: validation loss rose")


def test_an_overfitting_run_says_when_early_stopping_kept_the_best_epoch():
    history = _history([1.0, 0.8, 0.6, 0.5], [1.0, 0.85, 0.9, 0.95])
    kept = diagnose_curves(history, kept_epoch=2)
    assert kept.label == OVERFITTING
    assert kept.notes[-1] == ("the model kept is epoch 2's (early stopping restored the best "
                              "validation epoch)")
    assert diagnose_curves(history, kept_epoch=4).notes == ()


def test_the_loss_curve_plot_marks_the_best_epoch():
    from matplotlib.figure import Figure

    from dbspec.evaluation.plots import _DRAW

    ax = Figure().subplots()
    _DRAW["loss_curve"](ax, history=_history([1.0, 0.8, 0.6, 0.5], [1.0, 0.85, 0.9, 0.95]))
    labels = [line.get_label() for line in ax.lines]
    assert labels == ["train", "validation", "best epoch (2)"]
    assert list(ax.lines[2].get_xdata()) == [2, 2]

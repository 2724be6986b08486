"""The torch side of the spec's names: one list of losses, checked against the spec's."""

from __future__ import annotations

from typing import get_args

import pytest

from dbspec.spec.sections.training import DEFAULT_LOSS, LOSS_NAMES, TASK_LOSSES, LossName
from dbspec.training.components import LOSS_CLASSES, build_loss


def test_the_losses_torch_builds_are_the_losses_the_spec_names():
    assert set(LOSS_CLASSES) == set(LOSS_NAMES)
    assert tuple(get_args(LossName)) == ("auto", *LOSS_NAMES)


def test_each_task_defaults_to_a_loss_it_accepts():
    assert set(DEFAULT_LOSS) == set(TASK_LOSSES)
    for task, default in DEFAULT_LOSS.items():
        assert default == TASK_LOSSES[task][0]


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_every_loss_builds(name):
    assert isinstance(build_loss(name), LOSS_CLASSES[name])


def test_an_unresolved_or_unknown_loss_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown loss 'auto'; the spec's losses are mse, mae"):
        build_loss("auto")

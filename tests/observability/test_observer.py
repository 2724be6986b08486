"""What the observer measures of the model for the diagnosis."""

from __future__ import annotations

import torch

from dbspec.observability.observer import training_flops_per_row


def diabetes_mlp():
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                               torch.nn.Linear(32, 1))


def test_the_arithmetic_of_a_training_row_is_counted_without_touching_training():
    network = diabetes_mlp()
    network[2].eval()  # a module left in eval mode on purpose stays so
    example = torch.randn(2, 10)
    rng = torch.get_rng_state()
    assert training_flops_per_row(network, example) == 3 * 2 * (10 * 32 + 32 * 1)
    assert network.training and not network[2].training and network[0].training
    assert torch.equal(rng, torch.get_rng_state())  # dropout drew nothing


def test_a_network_the_counter_cannot_run_gives_no_estimate():
    network = diabetes_mlp()
    assert training_flops_per_row(network, torch.randn(2, 7)) is None  # wrong width
    assert network.training
    assert training_flops_per_row(network, None) is None

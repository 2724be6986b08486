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


def test_the_flops_are_counted_by_the_diagnosis_not_when_training_starts():
    """Search trials attach an observer but are never diagnosed: torch's first FLOP count
    (seconds, once a process) must not be paid per study (issue 35)."""
    from dbspec.observability.observer import TrainingObserver
    from dbspec.spec.sections import Spec

    spec = Spec.model_validate({
        "name": "flops", "data": {"source": {"kind": "sklearn", "name": "diabetes"},
                                  "task": "regression"},
        "model": {"layers": [{"linear": {"out": 1}}]}, "tracking": {"monitor": False}})
    network = diabetes_mlp()
    with TrainingObserver(spec, say=lambda text: None) as observer:
        observer.attach(network, torch.randn(2, 10))
        assert observer.parameters == 10 * 32 + 32 + 32 + 1
        assert observer.flops_per_row is None  # not counted yet
    observer.finish(device="cpu", threads=1, batch_size=2)
    assert observer.flops_per_row == 3 * 2 * (10 * 32 + 32 * 1)

"""The training loop: learning, early stopping with restore-best, schedules, resume."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dbspec.spec.sections.training import TrainingSpec
from dbspec.training.checkpoints import CheckpointStore
from dbspec.training.loop import Tensors, TrainingError, TrainOptions, train

CPU = torch.device("cpu")


def regression_data(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x @ torch.tensor([[1.0], [-2.0], [0.5], [0.0]])) + 0.01 * torch.randn(n, 1, generator=g)
    return Tensors(x[:200], y[:200], x[200:], y[200:])


def spec(**overrides) -> TrainingSpec:
    return TrainingSpec.model_validate({"optimizer": {"name": "adam", "lr": 0.05},
                                        "epochs": 30, "batch_size": 32, **overrides})


def net():
    torch.manual_seed(0)
    return nn.Linear(4, 1)


def test_it_learns():
    outcome = train(net(), regression_data(), spec(), loss="mse", device=CPU)
    assert outcome.history[-1]["val_loss"] < 0.01 < outcome.history[0]["val_loss"]
    assert outcome.epochs_run == 30 and outcome.samples_per_second > 0


def test_early_stopping_restores_the_best_weights():
    network = net()
    best_weights = {}

    def remember(*, epoch, metrics, improved, **_):
        if improved:
            best_weights["w"] = network.weight.detach().clone()

    outcome = train(network, regression_data(), spec(
        optimizer={"name": "sgd", "lr": 0.9}, epochs=60,
        early_stopping={"monitor": "val_loss", "patience": 3}), loss="mse", device=CPU,
        options=TrainOptions(callbacks=[remember]))
    assert outcome.stopped_early and outcome.epochs_run < 60
    assert outcome.best_epoch == outcome.epochs_run - 4
    assert torch.equal(network.weight, best_weights["w"])


def test_nan_loss_is_a_clear_error():
    data = regression_data()
    data.y_train[0] = float("nan")
    with pytest.raises(TrainingError, match="the loss became nan at epoch 1"):
        train(net(), data, spec(), loss="mse", device=CPU)


@pytest.mark.parametrize("extra", [
    {"scheduler": {"name": "step", "step_size": 5, "gamma": 0.5}},
    {"scheduler": {"name": "cosine"}},
    {"scheduler": {"name": "plateau", "patience": 1}},
    {"scheduler": {"name": "onecycle", "max_lr": 0.1}},
    {"gradient_clipping": {"max_norm": 0.5}},
    {"gradient_accumulation": 3},
    {"precision": "bf16"},
    {"optimizer": {"name": "rmsprop", "lr": 0.01}},
    {"optimizer": {"name": "adagrad", "lr": 0.3}},
    {"optimizer": {"name": "adamw", "lr": 0.05, "weight_decay": 0.01}},
])
def test_options_train(extra):
    outcome = train(net(), regression_data(), spec(**extra), loss="mse", device=CPU)
    assert outcome.history[-1]["val_loss"] < outcome.history[0]["val_loss"]


def test_step_scheduler_changes_the_rate():
    outcome = train(net(), regression_data(), spec(
        epochs=10, scheduler={"name": "step", "step_size": 5, "gamma": 0.1}), loss="mse",
        device=CPU)
    assert outcome.history[3]["lr"] == pytest.approx(0.05)
    assert outcome.history[6]["lr"] == pytest.approx(0.005)


def test_resume_continues_from_the_last_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    full = train(net(), regression_data(), spec(epochs=10), loss="mse", device=CPU)

    class Crash(Exception):
        pass

    def crash(*, epoch, **_):
        if epoch == 5:
            raise Crash

    with pytest.raises(Crash):
        train(net(), regression_data(), spec(epochs=10), loss="mse", device=CPU,
              options=TrainOptions(checkpoints=store, callbacks=[crash]))
    assert store.epochs() == [3, 4]  # the epoch that crashed never wrote its checkpoint
    resumed = train(net(), regression_data(), spec(epochs=10), loss="mse", device=CPU,
                    options=TrainOptions(checkpoints=store, resume=True))
    assert resumed.resumed_from == 5 and resumed.epochs_run == 10
    assert [h["train_loss"] for h in resumed.history] == pytest.approx(
        [h["train_loss"] for h in full.history], rel=1e-5)


def test_checkpoints_are_written_atomically(tmp_path):
    store = CheckpointStore(tmp_path, keep=1)
    store.save(0, {"x": 1})
    (tmp_path / ".epoch-1.pt.123-abcdef01.partial").write_bytes(b"half a file")  # a kill mid-write
    assert store.epochs() == [0] and store.load_latest() == {"x": 1}


def test_precision_auto_picks_bf16_on_capable_gpus_only():
    assert spec().precision == "auto"
    assert spec().precision_on(cuda=False) == "fp32"
    assert spec().precision_on(cuda=True, bf16_supported=True) == "bf16"
    assert spec().precision_on(cuda=True, bf16_supported=False) == "fp32"
    assert spec(precision="fp32").precision_on(cuda=True) == "fp32"


def test_resume_after_an_early_stop_does_not_train_on(tmp_path):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, 4, generator=g), torch.randn(200, 1, generator=g)
    data = Tensors(x[:160], y[:160], x[160:], y[160:])
    spec = TrainingSpec.model_validate({"optimizer": {"name": "sgd", "lr": 0.5}, "epochs": 50,
                                        "early_stopping": {"patience": 2}})
    store = CheckpointStore(tmp_path)
    torch.manual_seed(0)
    first = train(nn.Linear(4, 1), data, spec, loss="mse", device=torch.device("cpu"),
                  options=TrainOptions(checkpoints=store))
    assert first.stopped_early
    torch.manual_seed(0)
    again = train(nn.Linear(4, 1), data, spec, loss="mse", device=torch.device("cpu"),
                  options=TrainOptions(checkpoints=store, resume=True))
    assert again.epochs_run == first.epochs_run


def test_a_single_row_batch_with_batch_norm_trains(tmp_path):
    x, y = torch.randn(33, 4), torch.randn(33, 1)
    network = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    spec = TrainingSpec.model_validate({"epochs": 2, "batch_size": 32})
    outcome = train(network, Tensors(x, y), spec, loss="mse", device=torch.device("cpu"))
    assert outcome.epochs_run == 2

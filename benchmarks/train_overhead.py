"""Does dbspec's training loop cost more than a hand-written loop, a DataLoader, Lightning?

Same network (the monitoring spec's MLP: 100 -> 256 -> 128 -> 1), same synthetic data, same
batch size, same optimizer, same epochs, one shuffle per epoch and a validation loss each epoch
in all four; one process, the four interleaved (their order rotating each repeat), samples per
wall second and per CPU second of this process, best and median over the repeats, ratios of
the medians last:

- hand-written: ``perm = torch.randperm(n); x[perm[i:i+bs]]``, the loop people write;
- dbspec: ``dbspec.training.loop.train`` as the train stage calls it (checkpoint each epoch,
  early-stopping bookkeeping, per-epoch metrics callback);
- DataLoader, the documented fast way for in-memory tensors: a ``BatchSampler`` as the
  ``sampler`` and ``batch_size=None``, so ``TensorDataset`` gathers each batch with one index
  operation instead of collating it sample by sample;
- Lightning: a ``LightningModule`` fitted by ``lightning.Trainer`` over that DataLoader (no
  logger, checkpoints, progress bar or sanity check). Needs ``pip install lightning`` (the
  ``bench`` extra); without it the other three still run and the script says so.

Target: dbspec >= 0.95x the hand-written loop's samples/s.
Run: ``python benchmarks/train_overhead.py [--rows 200000] [--epochs 3] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import torch
from torch import nn

from dbspec.spec.sections.training import TrainingSpec
from dbspec.training.checkpoints import CheckpointStore
from dbspec.training.loop import Tensors, TrainOptions, train


def make_data(rows: int, features: int = 100):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, features, generator=generator)
    w = torch.randn(features, 1, generator=generator)
    y = ((x @ w).squeeze(1) > 0).float().unsqueeze(1)
    cut = int(rows * 0.9)
    return Tensors(x[:cut], y[:cut], x[cut:], y[cut:])


class Speed(NamedTuple):
    """Samples per wall second and per CPU second of this process."""

    wall: float
    cpu: float


def timed(samples: int, run: Callable[[], None], device=None) -> Speed:
    """Run ``run`` and turn its wall and CPU seconds into :class:`Speed`."""
    if device is not None:
        _sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    if device is not None:
        _sync(device)
    return Speed(samples / (time.perf_counter() - wall), samples / (time.process_time() - cpu))


def make_network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(100, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 1))


def hand_written(data: Tensors, epochs: int, batch: int, device, precision) -> Speed:
    network = make_network().to(device)
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    generator = torch.Generator().manual_seed(42)
    autocast = _autocast(device, precision)

    def run() -> None:
        for _ in range(epochs):
            network.train()
            perm = torch.randperm(len(data.x_train), generator=generator).to(device)
            for i in range(0, len(perm), batch):
                index = perm[i:i + batch]
                optimizer.zero_grad()
                with autocast():
                    loss = loss_fn(network(data.x_train[index]), data.y_train[index])
                loss.backward()
                optimizer.step()
            network.eval()
            with torch.no_grad(), autocast():
                loss_fn(network(data.x_val), data.y_val).item()

    return timed(epochs * len(data.x_train), run, device)


def _autocast(device, precision):
    import contextlib

    if precision == "fp32":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def with_dbspec(data: Tensors, epochs: int, batch: int, checkpoint_dir: Path, device,
                precision) -> Speed:
    network = make_network().to(device)
    spec = TrainingSpec.model_validate({"optimizer": {"name": "adam", "lr": 1e-3},
                                        "epochs": epochs, "batch_size": batch, "loss": "bce",
                                        "precision": precision,
                                        "early_stopping": {"monitor": "val_loss", "patience": 50,
                                                           "restore_best": False}})
    store = CheckpointStore(checkpoint_dir)
    seen = []
    options = TrainOptions(checkpoints=store,
                           callbacks=[lambda *, epoch, metrics, **_: seen.append(metrics)])
    return timed(epochs * len(data.x_train),
                 lambda: train(network, data, spec, loss="bce", device=device, options=options),
                 device)


def batch_loader(x: torch.Tensor, y: torch.Tensor, batch: int, seed: int = 42):
    """A DataLoader that gathers each shuffled batch with one index operation: a
    ``BatchSampler`` as the sampler, ``batch_size=None`` (no per-sample collate)."""
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

    dataset = TensorDataset(x, y)
    order = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    return DataLoader(dataset, sampler=BatchSampler(order, batch, drop_last=False),
                      batch_size=None)


def with_dataloader(data: Tensors, epochs: int, batch: int, device) -> Speed:
    network = make_network().to(device)
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    loader = batch_loader(data.x_train, data.y_train, batch)

    def run() -> None:
        for _ in range(epochs):
            network.train()
            for xb, yb in loader:
                optimizer.zero_grad()
                loss_fn(network(xb), yb).backward()
                optimizer.step()
            network.eval()
            with torch.no_grad():
                loss_fn(network(data.x_val), data.y_val).item()

    return timed(epochs * len(data.x_train), run, device)


def lightning_missing() -> Optional[str]:
    """Why the Lightning peer cannot run, or None."""
    try:
        import lightning  # noqa: F401
    except ImportError:
        return ("Lightning peer skipped: lightning is not installed "
                "(pip install lightning, or pip install -e '.[all,dev,bench]')")
    return None


def with_lightning(data: Tensors, epochs: int, batch: int) -> Speed:
    import lightning as L

    # its notices (no GPU, no workers, a logger to install) are not results
    warnings.filterwarnings("ignore", module="lightning")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.network = make_network()
            self.loss_fn = nn.BCEWithLogitsLoss()

        def training_step(self, pair, _index):
            return self.loss_fn(self.network(pair[0]), pair[1])

        def validation_step(self, pair, _index):
            self.loss_fn(self.network(pair[0]), pair[1]).item()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    module = Module()
    # the whole validation set as one batch, as the other three compute it
    validation = batch_loader(data.x_val, data.y_val, len(data.x_val))
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    return timed(epochs * len(data.x_train), lambda: trainer.fit(
        module, batch_loader(data.x_train, data.y_train, batch), validation))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    data = make_data(args.rows)
    data = Tensors(*(t.to(device) for t in (data.x_train, data.y_train, data.x_val, data.y_val)))
    missing = lightning_missing()
    if missing:
        print(missing)
    with tempfile.TemporaryDirectory() as tmp:
        peers: dict[str, Callable[[], Speed]] = {
            "hand-written": lambda: hand_written(data, args.epochs, args.batch, device,
                                                 args.precision),
            "dbspec": lambda: with_dbspec(data, args.epochs, args.batch, Path(tmp), device,
                                          args.precision)}
        if device.type == "cpu" and args.precision == "fp32":  # the peers' own settings
            peers["DataLoader"] = lambda: with_dataloader(data, args.epochs, args.batch, device)
            if not missing:
                peers["Lightning"] = lambda: with_lightning(data, args.epochs, args.batch)
        results: dict[str, list[Speed]] = {name: [] for name in peers}
        names = list(peers)
        for repeat in range(args.repeats):
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:
                results[name].append(peers[name]())
    print(f"{args.rows:,} rows x 100 features, batch {args.batch}, {args.epochs} epochs, "
          f"{args.device} {args.precision}, {args.threads} thread(s), {args.repeats} repeats, "
          "samples/s (best of the repeats / median):")
    for name, speeds in results.items():
        walls, cpus = [s.wall for s in speeds], [s.cpu for s in speeds]
        print(f"  {name:<13} wall {max(walls):>11,.0f} / {statistics.median(walls):>11,.0f}   "
              f"per CPU-second {max(cpus):>11,.0f} / {statistics.median(cpus):>11,.0f}")
    base = results["hand-written"]
    for name, speeds in results.items():
        if name == "hand-written":
            continue
        wall = statistics.median(s.wall for s in speeds) / statistics.median(s.wall for s in base)
        cpu = statistics.median(s.cpu for s in speeds) / statistics.median(s.cpu for s in base)
        target = " (target >= 0.95)" if name == "dbspec" else ""
        print(f"ratio {name} / hand-written (medians): wall {wall:.3f}, per CPU-second "
              f"{cpu:.3f}{target}")
    if missing:
        print(missing)


if __name__ == "__main__":
    main()

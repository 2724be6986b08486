"""Does dbspec's training loop cost more than a hand-written PyTorch loop?

Same network (the monitoring spec's MLP: 100 -> 256 -> 128 -> 1), same synthetic data, same
batches (one shuffle per epoch from the same seeded generator), same optimizer, same epochs, a
validation loss each epoch in all three; one process, runs interleaved, best of each reported:

- hand-written: ``perm = torch.randperm(n); x[perm[i:i+bs]]``, the loop people write;
- dbspec: ``dbspec.training.loop.train`` as the train stage calls it (checkpoint each epoch,
  early-stopping bookkeeping, per-epoch metrics callback);
- DataLoader: ``DataLoader(TensorDataset(x, y), batch_size, shuffle=True)``.

Target: dbspec >= 0.95x the hand-written loop's samples/s.
Run: ``python benchmarks/train_overhead.py [--rows 200000] [--epochs 3] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

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


def make_network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(100, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 1))


def hand_written(data: Tensors, epochs: int, batch: int, device, precision) -> float:
    network = make_network().to(device)
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    generator = torch.Generator().manual_seed(42)
    autocast = _autocast(device, precision)
    _sync(device)
    start = time.perf_counter()
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
    _sync(device)
    return epochs * len(data.x_train) / (time.perf_counter() - start)


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
                precision) -> float:
    network = make_network().to(device)
    spec = TrainingSpec.model_validate({"optimizer": {"name": "adam", "lr": 1e-3},
                                        "epochs": epochs, "batch_size": batch, "loss": "bce",
                                        "precision": precision,
                                        "early_stopping": {"monitor": "val_loss", "patience": 50,
                                                           "restore_best": False}})
    store = CheckpointStore(checkpoint_dir)
    seen = []
    _sync(device)
    start = time.perf_counter()
    train(network, data, spec, loss="bce", device=device, options=TrainOptions(
        checkpoints=store, callbacks=[lambda *, epoch, metrics, **_: seen.append(metrics)]))
    _sync(device)
    return epochs * len(data.x_train) / (time.perf_counter() - start)


def with_dataloader(data: Tensors, epochs: int, batch: int, device) -> float:
    from torch.utils.data import DataLoader, TensorDataset

    network = make_network().to(device)
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    loader = DataLoader(TensorDataset(data.x_train, data.y_train), batch_size=batch, shuffle=True,
                        generator=torch.Generator().manual_seed(42))
    start = time.perf_counter()
    for _ in range(epochs):
        network.train()
        for xb, yb in loader:
            optimizer.zero_grad()
            loss_fn(network(xb), yb).backward()
            optimizer.step()
        network.eval()
        with torch.no_grad():
            loss_fn(network(data.x_val), data.y_val).item()
    return epochs * len(data.x_train) / (time.perf_counter() - start)


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
    results: dict[str, list[float]] = {"hand-written": [], "dbspec": [], "DataLoader": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            results["hand-written"].append(hand_written(data, args.epochs, args.batch, device,
                                                        args.precision))
            results["dbspec"].append(with_dbspec(data, args.epochs, args.batch, Path(tmp), device,
                                                 args.precision))
            if device.type == "cpu":  # a DataLoader over GPU tensors is not a fair peer
                results["DataLoader"].append(with_dataloader(data, args.epochs, args.batch,
                                                             device))
    best = {name: max(values) for name, values in results.items() if values}
    base = best["hand-written"]
    print(f"{args.rows:,} rows x 100 features, batch {args.batch}, {args.epochs} epochs, "
          f"{args.device} {args.precision}, {args.threads} thread(s), best of {args.repeats} "
          "(median in brackets):")
    for name, values in ((n, v) for n, v in results.items() if v):
        print(f"  {name:<13} {best[name]:>12,.0f} samples/s  "
              f"({statistics.median(values):,.0f})  ratio {best[name] / base:.3f}")
    print(f"dbspec / hand-written = {best['dbspec'] / base:.3f} (target >= 0.95)")


if __name__ == "__main__":
    main()

"""What does watching a training run cost?

The same training (``dbspec.training.loop.train`` on the train_overhead benchmark's data and
MLP: 100 -> 256 -> 128 -> 1, 1 torch thread) with and without dbspec's observer: the resource
monitor sampling CPU, memory and (where NVML is present) GPUs on its thread, and the epoch
callback that adds each sample to the epoch's metrics. Runs alternate, best of each reported.
TensorBoard is measured separately (``--tensorboard``), since it writes files every epoch.

Target: with / without >= 0.98.
Run: ``python benchmarks/monitor_overhead.py [--rows 200000] [--epochs 3] [--repeats 3]
[--interval 1.0] [--tensorboard]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_overhead import make_data, make_network  # noqa: E402  (the same data and network)

from dbspec.spec.loader import build  # noqa: E402
from dbspec.spec.document import parse_document  # noqa: E402
from dbspec.training.loop import TrainOptions, train  # noqa: E402

SPEC = """\
name: monitor-overhead
data: {{source: {{kind: synthetic, rows: 100, features: 100}}, task: binary}}
model: {{layers: [{{linear: {{out: 1}}}}]}}
training: {{batch_size: {batch}, epochs: {epochs}, optimizer: {{name: adam, lr: 0.001}}}}
tracking: {{monitor: true, monitor_interval: {interval}, tensorboard: {tensorboard}}}
"""


def one_run(data, spec, *, observed: bool, log_dir: Path) -> float:
    from dbspec.monitoring.observer import TrainingObserver

    network = make_network()
    callbacks = []
    observer = None
    if observed:
        observer = TrainingObserver(spec, log_dir=log_dir, say=lambda text: None)
        observer.__enter__()
        observer.attach(network, data.x_train[:2])
        callbacks = [observer.callback]
    start = time.perf_counter()
    train(network, data, spec.training, loss="bce", device=torch.device("cpu"),
          options=TrainOptions(callbacks=callbacks))
    seconds = time.perf_counter() - start
    if observer is not None:
        observer.finish(device="cpu", threads=1, batch_size=spec.training.batch_size)
        observer.__exit__(None, None, None)
    return len(data.x_train) * spec.training.epochs / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--tensorboard", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = make_data(args.rows)
    text = SPEC.format(batch=args.batch, epochs=args.epochs, interval=args.interval,
                       tensorboard="true" if args.tensorboard else "false")
    spec = build(parse_document(text, "monitor-overhead.yaml")).spec
    best = {"without": 0.0, "with": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name in ("without", "with"):
                rate = one_run(data, spec, observed=name == "with",
                               log_dir=Path(tmp) / f"tb{repeat}")
                best[name] = max(best[name], rate)
                print(f"  run {repeat + 1} {name:<7} monitor: {rate:,.0f} samples/s",
                      flush=True)
    ratio = best["with"] / best["without"]
    what = "monitor" + (" + TensorBoard" if args.tensorboard else "")
    print(f"{args.rows:,} rows x {args.epochs} epochs, batch {args.batch}, 1 thread, "
          f"sampling every {args.interval:g} s: without {best['without']:,.0f} samples/s, "
          f"with {what} {best['with']:,.0f} samples/s = {ratio:.3f} (target >= 0.98)")


if __name__ == "__main__":
    main()

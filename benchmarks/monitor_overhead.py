"""What does watching a training run cost?

The same training (``dbspec.training.loop.train`` on the train_overhead benchmark's data and
MLP: 100 -> 256 -> 128 -> 1, 1 torch thread) with and without dbspec's observer: the resource
monitor sampling CPU, memory and (where NVML is present) GPUs on its thread, and the epoch
callback that adds each sample to the epoch's metrics. Runs alternate (which goes first
alternates too); samples per wall second and per CPU second of the process (the monitor's
thread included), best and median of each, the ratios of the medians last. TensorBoard is
measured separately (``--tensorboard``), since it writes files every epoch.

Target: with / without >= 0.98.
Run: ``python benchmarks/monitor_overhead.py [--rows 200000] [--epochs 3] [--repeats 3]
[--interval 1.0] [--tensorboard]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_overhead import Speed, make_data, make_network  # noqa: E402  (same data, network)

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


def one_run(data, spec, *, observed: bool, log_dir: Path) -> Speed:
    from dbspec.observability.observer import TrainingObserver

    network = make_network()
    callbacks = []
    observer = None
    if observed:
        observer = TrainingObserver(spec, log_dir=log_dir, say=lambda text: None)
        observer.__enter__()
        observer.attach(network, data.x_train[:2])
        callbacks = [observer.callback]
    start, cpu = time.perf_counter(), time.process_time()
    train(network, data, spec.training, loss="bce", device=torch.device("cpu"),
          options=TrainOptions(callbacks=callbacks))
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    if observer is not None:
        observer.finish(device="cpu", threads=1, batch_size=spec.training.batch_size)
        observer.__exit__(None, None, None)
    samples = len(data.x_train) * spec.training.epochs
    return Speed(samples / seconds, samples / cpu_seconds)


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
    results: dict[str, list[Speed]] = {"without": [], "with": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name in ("without", "with") if repeat % 2 == 0 else ("with", "without"):
                speed = one_run(data, spec, observed=name == "with",
                                log_dir=Path(tmp) / f"tb{repeat}")
                results[name].append(speed)
                print(f"  run {repeat + 1} {name:<7} monitor: {speed.wall:,.0f} samples/s, "
                      f"{speed.cpu:,.0f} per CPU-second", flush=True)
    what = "monitor" + (" + TensorBoard" if args.tensorboard else "")
    print(f"{args.rows:,} rows x {args.epochs} epochs, batch {args.batch}, 1 thread, "
          f"sampling every {args.interval:g} s, {args.repeats} repeats (best / median):")
    median = {}
    for name, speeds in results.items():
        walls, cpus = [x.wall for x in speeds], [x.cpu for x in speeds]
        median[name] = Speed(statistics.median(walls), statistics.median(cpus))
        print(f"  {name:<7} {what}: {max(walls):,.0f} / {median[name].wall:,.0f} samples/s, "
              f"{max(cpus):,.0f} / {median[name].cpu:,.0f} per CPU-second")
    print(f"ratio with / without {what} (medians): wall "
          f"{median['with'].wall / median['without'].wall:.3f}, per CPU-second "
          f"{median['with'].cpu / median['without'].cpu:.3f} (target >= 0.98)")

if __name__ == "__main__":
    main()

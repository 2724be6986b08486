"""What does logging each epoch's metrics to MLflow cost the training loop?

The diabetes data (442 x 10, standardised, 80% train), an MLP 10 -> 32 -> 1, batch 32, Adam,
one intra-op thread, trained by ``dbspec.training.loop.train`` with a per-epoch callback that
logs the epoch's ~10 metrics to a run in a SQLite tracking store, four ways:

- none: the callback does nothing (the floor);
- buffered: dbspec's :class:`~dbspec.tracking.metrics.MetricBuffer` (values kept with their
  wall-clock time and step, one ``log_batch`` every 5 s handed to MLflow's asynchronous
  logging, the rest sent and waited for at the end);
- buffered-sync: the same buffer sending every batch in the training thread;
- mlflow-async: ``MlflowClient.log_batch(..., synchronous=False)`` each epoch, MLflow's own
  asynchronous logging (a queue and a background thread), waited for at the end;
- sync-per-epoch: ``MlflowClient.log_batch`` each epoch, blocking (for reference).

Each timed run includes the final flush or wait, so every value is in the store when the clock
stops (checked). Arms are interleaved in one process, repeated; min and median wall seconds
and process CPU seconds (all threads: MLflow's background work counts) per arm are printed,
then each arm's ratio to ``none`` (median), CPU first, wall last.
Target: the logging arm dbspec uses costs < 5% (ratio <= 1.05).

Run: ``python benchmarks/metric_logging.py [--epochs 300] [--repeats 5] [--arms buffered,...]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from dbspec.spec.sections.training import TrainingSpec
from dbspec.tracking.metrics import MetricBuffer, now_ms
from dbspec.training.loop import Tensors, TrainOptions, train

ARMS = ("none", "buffered", "buffered-sync", "mlflow-async", "sync-per-epoch")


def diabetes() -> Tensors:
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.float32).unsqueeze(1)
    x = (x - x.mean(0)) / x.std(0)
    y = (y - y.mean()) / y.std()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    cut = int(len(x) * 0.8)
    train_rows, val_rows = order[:cut], order[cut:]
    return Tensors(x[train_rows], y[train_rows], x[val_rows], y[val_rows])


def logging_callback(arm: str, client, run_id: str):
    """The epoch callback of ``arm`` and what finishes its logging (flush, wait)."""
    if arm == "none":
        return (lambda **_: None), (lambda: None)
    if arm in ("buffered", "buffered-sync"):
        buffer = MetricBuffer(client, run_id, background=arm == "buffered")
        return (lambda *, epoch, metrics, **_: buffer.log(metrics, epoch)), buffer.flush
    from mlflow.entities import Metric

    pending = []

    def entities(epoch, metrics):
        stamp = now_ms()
        return [Metric(k, float(v), stamp, epoch) for k, v in metrics.items()]

    if arm == "mlflow-async":
        def log(*, epoch, metrics, **_):
            pending.append(client.log_batch(run_id, metrics=entities(epoch, metrics),
                                            synchronous=False))

        def finish():
            for operation in pending:
                operation.wait()

        return log, finish
    return (lambda *, epoch, metrics, **_: client.log_batch(
        run_id, metrics=entities(epoch, metrics))), (lambda: None)


def one_run(arm: str, data: Tensors, spec: TrainingSpec, client,
            experiment: str) -> tuple[float, float]:
    """Wall and CPU seconds (every thread of the process) of one training with ``arm``."""
    run_id = client.create_run(experiment, run_name=arm).info.run_id
    callback, finish = logging_callback(arm, client, run_id)
    torch.manual_seed(0)
    network = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    started, cpu = time.perf_counter(), time.process_time()
    train(network, data, spec, loss="mse", device=torch.device("cpu"),
          options=TrainOptions(callbacks=[callback]))
    finish()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    client.set_terminated(run_id)
    if arm != "none":
        logged = client.get_metric_history(run_id, "train_loss")
        assert len(logged) == spec.epochs, f"{arm}: {len(logged)} of {spec.epochs} epochs logged"
        assert all(m.timestamp > 1e12 for m in logged), f"{arm}: a timestamp is not wall time"
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--arms", default=",".join(ARMS),
                        help="comma-separated subset of " + ", ".join(ARMS) + " (none always)")
    args = parser.parse_args()
    arms = ("none", *(a for a in ARMS[1:] if a in args.arms.split(",")))
    import logging

    import mlflow

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    data = diabetes()
    spec = TrainingSpec.model_validate({"optimizer": {"name": "adam", "lr": 1e-3},
                                        "epochs": args.epochs, "batch_size": 32})
    seconds: dict[str, list[float]] = {arm: [] for arm in arms}
    cpu: dict[str, list[float]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as tmp:
        client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{Path(tmp) / 'mlflow.db'}")
        experiment = client.create_experiment("metric-logging",
                                              artifact_location=Path(tmp).as_uri())
        for arm in arms:  # warm-up: imports, the store's first writes, the async queue
            one_run(arm, data, spec.model_copy(update={"epochs": 5}), client, experiment)
        for repeat in range(args.repeats):
            order = arms if repeat % 2 == 0 else arms[::-1]
            for arm in order:
                wall, used = one_run(arm, data, spec, client, experiment)
                seconds[arm].append(wall)
                cpu[arm].append(used)
            print(f"  repeat {repeat + 1}: " + ", ".join(f"{a} {seconds[a][-1]:.3f} s"
                                                        for a in arms), file=sys.stderr)
    steps = args.epochs * -(-len(data.x_train) // 32)
    print(f"diabetes {len(data.x_train)} training rows, {args.epochs} epochs ({steps} steps), "
          f"{args.repeats} repeats, interleaved")
    for arm in arms:
        print(f"{arm:>15}: min {min(seconds[arm]):.3f} s, median "
              f"{statistics.median(seconds[arm]):.3f} s, "
              f"{1000 * statistics.median(seconds[arm]) / args.epochs:.2f} ms/epoch; CPU min "
              f"{min(cpu[arm]):.3f} s, median {statistics.median(cpu[arm]):.3f} s")
    cpu_floor = statistics.median(cpu["none"])
    for arm in arms[1:]:
        print(f"CPU ratio {arm} / none (median): {statistics.median(cpu[arm]) / cpu_floor:.3f}")
    floor = statistics.median(seconds["none"])
    for arm in arms[1:]:
        print(f"ratio {arm} / none (median wall): "
              f"{statistics.median(seconds[arm]) / floor:.3f}")


if __name__ == "__main__":
    main()

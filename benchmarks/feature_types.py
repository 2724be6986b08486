"""Typed features on mixed data: dbspec's embedding model against a one-hot MLP and against the
same network written by hand in PyTorch (issue 19).

Data: dbspec's own ``synthetic`` source, ``generator: mixed`` (numeric ``f0..f7`` plus string
IDs ``user_id`` of ``--cardinality`` values and ``item_id`` of a quarter as many, whose random
per-ID effects and a user x item-category interaction make up 60% of the latent score), read
once here with the source kind's ``read``, binary task, split 70/15/15 (seed 3).

Three models, each ``--repeats`` times, their order rotating each repeat; repeat ``r`` trains
all three with training seed ``3 + r`` (same rows, same split), so the metrics' min-max is a
spread over seeds and the speeds are of the same work:

- **dbspec embedding**: ``dbspec run`` (a process of its own) of a spec equal to
  ``specs/mixed_tabular.yaml`` but for the sizes given here and without its registry section
  and plot: ``standard_scale`` on the numeric columns, an embedding of 16 for ``user_id`` and
  of 8 for ``item_id`` (vocabularies fitted on the training rows, index 0 for unknown IDs),
  concatenated with the numeric columns under Linear 64, ReLU, Linear 32, ReLU, Linear 1;
  Adam (lr 0.003), BCE, batch 256, ``--epochs`` epochs, early stopping on ``val_loss``
  (patience 3, best weights restored). The first repeat runs every stage; later ones
  ``--from train --set training.seed=...`` (the data stages are cached).
- **dbspec one-hot**: the same rows with ``user_id`` and ``item_id`` one-hot encoded
  (``pandas.get_dummies`` over every ID in the data: one 0/1 column per ID) into a Parquet
  file, trained by ``dbspec run`` as a plain numeric spec: the same head, optimizer, batch,
  epochs, early stopping and seed; ``standard_scale`` on ``f0..f7`` only (scaling a 0/1
  column of a rare ID would blow it up to tens of units).
- **hand-written**: the embedding model's architecture in plain PyTorch (``nn.Embedding``
  per ID with the same sizes, vocabularies from the training rows, 0 for unknown; the
  numeric columns standardised with the training rows' mean and deviation; the same head,
  built after ``torch.manual_seed(seed)``), the same optimizer, loss, batch, epochs, early
  stopping and shuffling (``torch.randperm`` from a generator with the seed), mini-batches
  gathered by index from in-memory tensors, on as many torch threads as dbspec reported
  using. It trains and is scored on dbspec's own split (read from the embedding run's
  ``split`` stage, checked equal to the one-hot run's); its parameter shapes are checked
  against dbspec's saved weights. It runs in this process.

What is compared: the test split's ROC AUC and accuracy (dbspec's from ``--summary-json``,
the hand-written model's with scikit-learn on its restored best weights), and training
samples/s as dbspec's loop (``dbspec/training/loop.py``) counts it: training rows x epochs
run, over the summed seconds of each epoch's training pass (the shuffle, every batch's
gather, forward, backward and optimizer step, and the epoch's loss total) without the
validation pass, early-stopping copies, checkpoints or the data stages. The hand-written loop
is timed over the same span. Medians over the repeats with their min and max.

Those are wall seconds of separate processes at different moments, on a shared machine: they
cannot resolve 5%. So a **loop check** follows, in this process: dbspec's own network (rebuilt
from the embedding run's model card) on the run's encoded matrix, trained by
:func:`dbspec.training.loop.train`, against the hand-written loop and network, ``--loop-epochs``
epochs without validation, interleaved ``--loop-repeats`` times, in samples per CPU second
of this process (what other work skews least) as well as per wall second.

Targets (issue 19): dbspec's embedding model >= 0.95 x the hand-written model's samples/s,
and a clearly better test ROC AUC than the one-hot MLP. A missed target is a measurement:
the exit status stays 0; a failed run exits non-zero. The one-hot run needs memory: ~7 GiB
peak for the default 100,000 rows x 2,508 columns.
Run: ``python benchmarks/feature_types.py [--rows 100000] [--cardinality 2000] [--epochs 15]
[--repeats 3] [--loop-epochs 3] [--loop-repeats 5] [--keep DIR]`` (about 6 minutes here);
``--quick`` for a small try (20,000 rows, cardinality 500, 2 epochs, 1 repeat, loop check
1 epoch x 2).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

SEED = 3
BATCH = 256
LR = 0.003
PATIENCE = 3
USER_DIM, ITEM_DIM = 16, 8
HIDDEN = (64, 32)
NUMERIC = [f"f{i}" for i in range(8)]
IDS = ("user_id", "item_id")
SAMPLES_TARGET = 0.95

_SOURCE = ("{{kind: synthetic, generator: mixed, rows: {rows}, features: 8, "
           "cardinality: {cardinality}, seed: 3}}")
_TRAINING = """\
model:
{encoders}  layers:
    - linear: {{out: 64}}
    - relu
    - linear: {{out: 32}}
    - relu
    - linear: {{out: 1}}
training:
  optimizer: {{name: adam, lr: 0.003}}
  loss: bce
  epochs: {epochs}
  batch_size: 256
  early_stopping: {{monitor: val_loss, patience: 3, restore_best: true}}
  seed: 3
evaluation:
  metrics: [accuracy, roc_auc, log_loss]
"""
EMBEDDING_SPEC = """\
name: mixed-tabular
data:
  source: {source}
  task: binary
  target: target
  features: [f0, f1, f2, f3, f4, f5, f6, f7, {{name: user_id, type: categorical}},
             {{name: item_id, type: categorical}}]
  split: {{validation: 0.15, test: 0.15, seed: 3}}
  preprocessing:
    - standard_scale: all
""" + _TRAINING
ONE_HOT_SPEC = """\
name: mixed-one-hot
data:
  source: {{kind: parquet, path: {path}}}
  task: binary
  target: target
  split: {{validation: 0.15, test: 0.15, seed: 3}}
  preprocessing:
    - standard_scale: [f0, f1, f2, f3, f4, f5, f6, f7]
""" + _TRAINING
ENCODERS = ("  encoders:\n    user_id: {kind: embedding, dim: 16}\n"
            "    item_id: {kind: embedding, dim: 8}\n")


def make_frame(rows: int, cardinality: int):
    """The mixed rows, generated by dbspec's own synthetic source."""
    from dbspec.seams.sources import source_kind
    from dbspec.spec.sections.data import DataSpec

    source = {"kind": "synthetic", "generator": "mixed", "rows": rows, "features": 8,
              "cardinality": cardinality, "seed": SEED}
    data = DataSpec.model_validate({"source": source, "task": "binary", "target": "target"})
    return source_kind(data).read(data, base=Path.cwd()).frame


def write_one_hot(frame, path: Path) -> int:
    """``frame`` with its ID columns one-hot encoded (uint8), as Parquet; returns the number
    of feature columns."""
    import pandas as pd

    dummies = pd.get_dummies(frame[list(IDS)], dtype=np.uint8)
    wide = pd.concat([frame[NUMERIC], dummies, frame[["target"]]], axis=1)
    wide.to_parquet(path, index=False)
    return wide.shape[1] - 1


class DbspecProject:
    """One spec in a project directory of its own, run by ``dbspec run`` in a new process."""

    def __init__(self, directory: Path, spec: str):
        self.directory = directory
        directory.mkdir(parents=True)
        (directory / "spec.yaml").write_text(spec)
        self.runs = 0

    def run(self, seed: int) -> dict:
        """Run the spec with ``training.seed`` set to ``seed`` (from ``train`` on after the
        first run); the summary's figures, wall seconds and the process's peak RSS.

        Raises:
            SystemExit: the run failed (with the end of its output).
        """
        command = [sys.executable, "-m", "dbspec", "run", "spec.yaml", "--quiet",
                   "--summary-json", "summary.json", "--set", f"training.seed={seed}"]
        command += ["--from", "train"] if self.runs else []
        env = {**os.environ,
               "MLFLOW_TRACKING_URI": f"sqlite:///{self.directory / '.dbspec' / 'mlflow.db'}"}
        log = self.directory / f"run-{self.runs}.log"
        started = time.perf_counter()
        with open(log, "wb") as out:
            child = subprocess.Popen(command, cwd=self.directory, env=env, stdout=out,
                                     stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        self.runs += 1
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            raise SystemExit(f"{' '.join(command)} in {self.directory} failed ({code}):\n"
                             f"{log.read_text()[-4000:]}")
        summary = json.loads((self.directory / "summary.json").read_text())
        trained = [s["action"] for s in summary["stages"] if s["name"] == "train"]
        if trained != ["ran"]:
            raise SystemExit(f"dbspec run in {self.directory}: the train stage {trained}, "
                             "not ran; the figures would be stale")
        training, metrics = summary["training"], summary["metrics"]
        return {"samples_per_second": training["train_samples_per_second"],
                "threads": training["threads"], "epochs": training["epochs_run"],
                "roc_auc": metrics["test_roc_auc"], "accuracy": metrics["test_accuracy"],
                "wall": seconds, "peak_mib": usage.ru_maxrss / 1024}

    def stage_dir(self, stage: str) -> Path:
        """The directory of ``stage``'s current output in the project's state."""
        found = list((self.directory / ".dbspec" / "runs").glob(f"*/stages/{stage}"))
        if len(found) != 1:
            raise SystemExit(f"expected one {stage} stage under {self.directory}, found "
                             f"{len(found)}")
        return found[0].resolve()

    def splits(self) -> dict[str, np.ndarray]:
        """The train/validation/test row indices dbspec's ``split`` stage wrote."""
        arrays = np.load(self.stage_dir("split") / "splits.npz")
        return {name: arrays[name] for name in ("train", "validation", "test")}


# --- the hand-written model --------------------------------------------------------------

def hand_data(frame, splits: dict[str, np.ndarray]):
    """Tensors per split: standardised numeric columns, ID indices (0: not in the training
    rows), float targets (N, 1); and each ID's table size."""
    import torch

    train = splits["train"]
    numbers = frame[NUMERIC].to_numpy(np.float64)
    mean, std = numbers[train].mean(axis=0), numbers[train].std(axis=0)
    numbers = ((numbers - mean) / np.where(std > 0, std, 1.0)).astype(np.float32)
    indices, sizes = {}, {}
    for column in IDS:
        values = frame[column].to_numpy(dtype=object)
        known = {value: i + 1 for i, value in enumerate(sorted(set(values[train])))}
        indices[column] = np.array([known.get(value, 0) for value in values], dtype=np.int64)
        sizes[column] = len(known) + 1
    target = frame["target"].to_numpy(np.float32).reshape(-1, 1)

    def part(rows):
        return (torch.from_numpy(numbers[rows]), torch.from_numpy(indices["user_id"][rows]),
                torch.from_numpy(indices["item_id"][rows]), torch.from_numpy(target[rows]))

    return {name: part(rows) for name, rows in splits.items()}, sizes


def hand_network(sizes: dict[str, int], seed: int = SEED):
    """Embeddings of the IDs concatenated after the numeric columns, under the MLP head; the
    modules are created in dbspec's order (encoders, then head) after the same seed."""
    import torch
    from torch import nn

    class MixedNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.user = nn.Embedding(sizes["user_id"], USER_DIM, padding_idx=0)
            self.item = nn.Embedding(sizes["item_id"], ITEM_DIM, padding_idx=0)
            width = len(NUMERIC) + USER_DIM + ITEM_DIM
            self.head = nn.Sequential(nn.Linear(width, HIDDEN[0]), nn.ReLU(),
                                      nn.Linear(HIDDEN[0], HIDDEN[1]), nn.ReLU(),
                                      nn.Linear(HIDDEN[1], 1))

        def forward(self, numbers, user, item):
            return self.head(torch.cat([numbers, self.user(user), self.item(item)], dim=1))

    torch.manual_seed(seed)
    return MixedNet()


def train_epoch(network, optimizer, loss_fn, generator, train) -> float:
    """One shuffled pass over the training tensors in batches gathered by index; returns the
    summed loss (read once, at the end, as dbspec's loop does)."""
    import torch

    numbers, users, items, target = train
    network.train()
    order = torch.randperm(len(target), generator=generator)
    total = torch.zeros(())
    for start in range(0, len(target), BATCH):
        index = order[start:start + BATCH]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(network(numbers[index], users[index], items[index]), target[index])
        loss.backward()
        optimizer.step()
        total += loss.detach() * len(index)
    return float(total)


def _hand_setup(sizes: dict[str, int], seed: int = SEED):
    import torch
    from torch import nn

    network = hand_network(sizes, seed)
    return (network, torch.optim.Adam(network.parameters(), lr=LR), nn.BCEWithLogitsLoss(),
            torch.Generator().manual_seed(seed))


def hand_written(data, sizes: dict[str, int], epochs: int, threads: int, seed: int) -> dict:
    """Train the hand-written model with early stopping; its test metrics and training
    samples/s (the epochs' training passes only, as dbspec times them)."""
    import torch
    from sklearn.metrics import accuracy_score, roc_auc_score

    torch.set_num_threads(threads)
    network, optimizer, loss_fn, generator = _hand_setup(sizes, seed)
    best, best_state, waited, samples, seconds, run = None, None, 0, 0, 0.0, 0
    for _ in range(epochs):
        started = time.perf_counter()
        train_epoch(network, optimizer, loss_fn, generator, data["train"])
        seconds += time.perf_counter() - started
        samples += len(data["train"][3])
        run += 1
        network.eval()
        with torch.inference_mode():
            val_loss = float(loss_fn(network(*data["validation"][:3]), data["validation"][3]))
        if best is None or val_loss < best:
            best, best_state, waited = val_loss, copy.deepcopy(network.state_dict()), 0
        else:
            waited += 1
            if waited >= PATIENCE:
                break
    network.load_state_dict(best_state)
    network.eval()
    with torch.inference_mode():
        scores = network(*data["test"][:3]).squeeze(1).numpy()
    truth = data["test"][3].squeeze(1).numpy()
    return {"samples_per_second": samples / seconds, "threads": threads, "epochs": run,
            "roc_auc": float(roc_auc_score(truth, scores)),
            "accuracy": float(accuracy_score(truth, scores >= 0)), "wall": seconds,
            "peak_mib": None}


class Speed(NamedTuple):
    """Training samples per wall second and per CPU second of this process."""

    wall: float
    cpu: float


def _clocked(samples: int, run: Callable[[], None]) -> Speed:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return Speed(samples / (time.perf_counter() - wall), samples / (time.process_time() - cpu))


def loop_check(project: DbspecProject, data, sizes: dict[str, int], splits, *, epochs: int,
               repeats: int, threads: int) -> dict[str, list[Speed]]:
    """dbspec's training loop and network against the hand-written ones, in this process,
    per CPU second (which other work on a shared machine skews far less than wall time).

    dbspec side: the network the embedding run built (``ServedModel`` from its card, after
    the same seed), the run's encoded matrix (``preprocess`` stage) through its fitted
    transform, trained by :func:`dbspec.training.loop.train` as ``fit_spec`` calls it. Both
    sides: ``epochs`` epochs, no validation split and no early stopping, so each call is the
    training passes alone. Interleaved, ``repeats`` times each.
    """
    import torch

    from dbspec.models.card import read_card, training_targets
    from dbspec.models.served import ServedModel
    from dbspec.spec.sections.training import TrainingSpec
    from dbspec.training.loop import Tensors, train

    torch.set_num_threads(threads)
    card = read_card(project.stage_dir("train") / "served")
    rows = splits["train"]
    encoded = np.load(project.stage_dir("preprocess") / "encoded.npz")["features"][rows]
    target = np.load(project.stage_dir("load_data") / "table.npz")["target"][rows]
    spec = TrainingSpec.model_validate({"optimizer": {"name": "adam", "lr": LR}, "loss": "bce",
                                        "epochs": epochs, "batch_size": BATCH, "seed": SEED})
    samples = epochs * len(rows)

    def with_dbspec() -> Speed:
        torch.manual_seed(SEED)
        served = ServedModel(card)
        with torch.no_grad():
            tensors = Tensors(served.transform(torch.from_numpy(encoded)),
                              training_targets(card, torch.from_numpy(target)))
        return _clocked(samples, lambda: train(served.network, tensors, spec, loss=card.loss,
                                               device=torch.device("cpu")))

    def by_hand() -> Speed:
        network, optimizer, loss_fn, generator = _hand_setup(sizes)
        return _clocked(samples, lambda: [train_epoch(network, optimizer, loss_fn, generator,
                                                      data["train"]) for _ in range(epochs)])

    speeds: dict[str, list[Speed]] = {"dbspec embedding": [], "hand-written": []}
    for repeat in range(repeats):
        order = [("dbspec embedding", with_dbspec), ("hand-written", by_hand)]
        for name, peer in order[::-1] if repeat % 2 else order:
            speeds[name].append(peer())
    return speeds


def check_architecture(project: DbspecProject, sizes: dict[str, int]) -> int:
    """dbspec's trained weights and the hand-written network have the same parameter shapes,
    in the same order; returns the parameter count.

    Raises:
        SystemExit: they differ.
    """
    import torch

    saved = torch.load(project.stage_dir("train") / "served" / "weights.pt", weights_only=True)
    theirs = [tuple(t.shape) for key, t in saved.items() if key.startswith("network.")]
    ours = [tuple(p.shape) for p in hand_network(sizes).parameters()]
    if theirs != ours:
        raise SystemExit(f"the hand-written network is not dbspec's: parameter shapes {ours} "
                         f"against dbspec's {theirs}")
    return sum(int(np.prod(shape)) for shape in ours)


def check_rows(project: DbspecProject, frame) -> None:
    """dbspec read the same rows (the same targets in the same order) as this script."""
    stored = np.load(project.stage_dir("load_data") / "table.npz")["target"]
    if not np.array_equal(stored, frame["target"].to_numpy()):
        raise SystemExit(f"dbspec's rows in {project.directory} differ from this script's")


# --- report ------------------------------------------------------------------------------

def _spread(values: list[float], fmt: str) -> str:
    median = statistics.median(values)
    if len(values) == 1:
        return format(median, fmt)
    return f"{format(median, fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def report(results: dict[str, list[dict]], args, columns: int, parameters: int) -> None:
    """The runs' table and the two targets' figures (the speed target from wall seconds)."""
    print(f"\n{args.rows:,} rows ({columns:,} one-hot feature columns), cardinality "
          f"{args.cardinality:,}, batch {BATCH}, up to {args.epochs} epochs (early stopping, "
          f"patience {PATIENCE}); hand-written and dbspec embedding models: {parameters:,} "
          "parameters. Medians (min-max) over the repeats; train samples/s per wall second:")
    print(f"  {'model':<18} {'test roc_auc':>24} {'test accuracy':>24} "
          f"{'train samples/s':>28} {'epochs':>8} {'threads':>7} {'peak MiB':>9}")
    for name, runs in results.items():
        peaks = [r["peak_mib"] for r in runs if r["peak_mib"] is not None]
        print(f"  {name:<18} {_spread([r['roc_auc'] for r in runs], '.4f'):>24} "
              f"{_spread([r['accuracy'] for r in runs], '.4f'):>24} "
              f"{_spread([r['samples_per_second'] for r in runs], ',.0f'):>28} "
              f"{'/'.join(str(r['epochs']) for r in runs):>8} "
              f"{'/'.join(sorted({str(r['threads']) for r in runs})):>7} "
              f"{(f'{max(peaks):,.0f}' if peaks else '-'):>9}")
    speed = {name: statistics.median(r["samples_per_second"] for r in runs)
             for name, runs in results.items()}
    auc = {name: statistics.median(r["roc_auc"] for r in runs) for name, runs in results.items()}
    ratio = speed["dbspec embedding"] / speed["hand-written"]
    print(f"samples/s dbspec embedding / hand-written, wall: {ratio:.3f} (target >= "
          f"{SAMPLES_TARGET}: {_verdict(ratio)}); same repeat: "
          + ", ".join(f"{e['samples_per_second'] / h['samples_per_second']:.3f}" for e, h in
                      zip(results["dbspec embedding"], results["hand-written"])))
    print(f"samples/s dbspec one-hot / dbspec embedding, wall: "
          f"{speed['dbspec one-hot'] / speed['dbspec embedding']:.3f} (the wide first layer)")
    gain = auc["dbspec embedding"] - auc["dbspec one-hot"]
    print(f"test roc_auc dbspec embedding - one-hot: {gain:+.4f} "
          f"({auc['dbspec embedding']:.4f} vs {auc['dbspec one-hot']:.4f}; target: clearly "
          f"better); hand-written - dbspec embedding: "
          f"{auc['hand-written'] - auc['dbspec embedding']:+.4f}")


def report_loop(speeds: dict[str, list[Speed]], epochs: int) -> None:
    """The in-process loop check: per wall and per CPU second, and the CPU ratio."""
    print(f"\nloop check in this process ({epochs} epoch(s) of training passes, no validation; "
          f"{len(speeds['hand-written'])} interleaved repeats), samples/s medians (min-max):")
    for name, runs in speeds.items():
        print(f"  {name:<18} wall {_spread([r.wall for r in runs], ',.0f'):>28}   per "
              f"CPU-second {_spread([r.cpu for r in runs], ',.0f'):>28}")
    mine, theirs = speeds["dbspec embedding"], speeds["hand-written"]
    cpu = statistics.median(r.cpu for r in mine) / statistics.median(r.cpu for r in theirs)
    wall = statistics.median(r.wall for r in mine) / statistics.median(r.wall for r in theirs)
    print(f"samples/s dbspec embedding / hand-written, per CPU-second: {cpu:.3f} (target >= "
          f"{SAMPLES_TARGET}: {_verdict(cpu)}); wall {wall:.3f}")


def _verdict(ratio: float) -> str:
    return "met" if ratio >= SAMPLES_TARGET else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--cardinality", type=int, default=2_000,
                        help="user IDs (items: a quarter as many)")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loop-epochs", type=int, default=3)
    parser.add_argument("--loop-repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true",
                        help="20,000 rows, cardinality 500, 2 epochs, 1 repeat, a loop check of "
                             "1 epoch x 2")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the projects in this (new) directory")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.cardinality, args.epochs, args.repeats = 20_000, 500, 2, 1
        args.loop_epochs, args.loop_repeats = 1, 2
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    root = args.keep or Path(tempfile.mkdtemp(prefix="dbspec-feature-types-"))
    root.mkdir(parents=True, exist_ok=args.keep is None)
    try:
        began = time.perf_counter()
        frame = make_frame(args.rows, args.cardinality)
        columns = write_one_hot(frame, root / "one_hot.parquet")
        print(f"data: {len(frame):,} rows, {frame['user_id'].nunique():,} users, "
              f"{frame['item_id'].nunique():,} items, positives {frame['target'].mean():.3f}; "
              f"one-hot: {columns:,} columns ({time.perf_counter() - began:.1f} s)")
        source = _SOURCE.format(rows=args.rows, cardinality=args.cardinality)
        projects = {
            "dbspec embedding": DbspecProject(root / "embedding", EMBEDDING_SPEC.format(
                source=source, encoders=ENCODERS, epochs=args.epochs)),
            "dbspec one-hot": DbspecProject(root / "one_hot", ONE_HOT_SPEC.format(
                path=root / "one_hot.parquet", encoders="", epochs=args.epochs))}
        results: dict[str, list[dict]] = {name: [] for name in (*projects, "hand-written")}
        prepared: dict = {}

        def prepare() -> None:
            """After the first dbspec runs: their split (checked to agree), the hand-written
            model's tensors, its architecture checked against dbspec's weights."""
            embedding = projects["dbspec embedding"]
            splits = embedding.splits()
            other = projects["dbspec one-hot"].splits()
            if any(not np.array_equal(splits[k], other[k]) for k in splits):
                raise SystemExit("the two dbspec runs split the rows differently")
            check_rows(embedding, frame)
            data, sizes = hand_data(frame, splits)
            prepared.update(splits=splits, data=data, sizes=sizes,
                            parameters=check_architecture(embedding, sizes),
                            threads=results["dbspec embedding"][0]["threads"])

        def run_hand(seed: int) -> dict:
            if not prepared:
                prepare()
            return hand_written(prepared["data"], prepared["sizes"], args.epochs,
                                prepared["threads"], seed)

        peers: dict[str, Callable[[int], dict]] = {name: project.run
                                                   for name, project in projects.items()}
        peers["hand-written"] = run_hand
        names = list(peers)  # both dbspec runs first: the hand-written model needs their split
        for repeat in range(args.repeats):
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:
                figures = peers[name](SEED + repeat)
                results[name].append(figures)
                print(f"  repeat {repeat + 1} {name}: roc_auc {figures['roc_auc']:.4f}, "
                      f"accuracy {figures['accuracy']:.4f}, "
                      f"{figures['samples_per_second']:,.0f} samples/s, "
                      f"{figures['epochs']} epochs, {figures['wall']:.1f} s", flush=True)
        speeds = loop_check(projects["dbspec embedding"], prepared["data"], prepared["sizes"],
                            prepared["splits"], epochs=args.loop_epochs,
                            repeats=args.loop_repeats, threads=prepared["threads"])
        report(results, args, columns, prepared["parameters"])
        report_loop(speeds, args.loop_epochs)
        print(f"load average at the end: {os.getloadavg()[0]:.2f}; total "
              f"{time.perf_counter() - began:.0f} s")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

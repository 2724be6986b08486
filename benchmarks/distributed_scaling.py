"""What do 2 DDP processes buy over 1, and what does launching them cost?

On the synthetic 100-feature two-class data of the monitoring demo (`specs/diabetes_distributed`
-style MLP 100-256-128-1, batch 256 per process), one process: dbspec's in-process training,
then TorchDistributor (gloo, local mode) with 1 and 2 processes. Prints samples/s (summed over
ranks) and the fixed launch overhead (distributor wall time minus the ranks' training time).

The same with DeepspeedTorchDistributor (ZeRO-2, fp32, gloo) for 2 processes. The four
configurations run ``--repeats`` times, their order rotating each repeat; best and median of
each, the ratios of the medians last.
Run: ``python benchmarks/distributed_scaling.py [--rows 200000] [--epochs 3] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

SPEC = """\
name: scaling
data: {source: {kind: synthetic, rows: %(rows)d, features: 100, seed: 1}, task: binary,
       split: {validation: 0.05, test: 0.05}}
model: {layers: [{linear: {out: 256}}, relu, {linear: {out: 128}}, relu, {linear: {out: 1}}]}
training: {epochs: %(epochs)d, batch_size: 256, checkpointing: {enabled: false}}
compute: %(compute)s
"""
DDP = "{kind: torch_distributor, num_processes: %d, use_gpu: false}"
DEEPSPEED = "{kind: deepspeed, num_gpus: %d, use_gpu: false, zero_stage: 2}"


def prepare(rows: int, epochs: int, processes: int, workdir: Path, engine: str = DDP):
    from dbspec.data.prepare import build_table, fit_preprocessing, split_rows
    from dbspec.seams.sources import source_kind
    from dbspec.spec import load_spec

    path = workdir / f"scaling-{processes}.yaml"
    path.write_text(SPEC % {"rows": rows, "epochs": epochs, "compute": engine % processes})
    spec = load_spec(str(path)).spec
    table = build_table(source_kind(spec.data).read(spec.data, base=workdir).frame, spec.data)
    splits = split_rows(table, spec.data)
    return spec, table, splits, fit_preprocessing(spec.data, table, splits.train)


def distributed(rows: int, epochs: int, processes: int, workdir: Path, engine: str = DDP) -> dict:
    from dbspec.spark import spark_session
    from dbspec.training.fit import FitOptions, fit_spec

    spec, table, splits, fitted = prepare(rows, epochs, processes, workdir, engine)
    work = workdir / f"work-{processes}-{spec.compute.kind}"
    with spark_session(spec, master="local[2]"):
        started = time.perf_counter()
        result = fit_spec(spec, table, splits, fitted, FitOptions(work_dir=work))
        wall = time.perf_counter() - started
    ranks = [json.loads(p.read_text()) for p in sorted(work.glob("rank-*.json"))]
    training = max(r["seconds"] for r in ranks)
    return {"samples_per_second": sum(r["samples_per_second"] for r in ranks),
            "wall": wall, "overhead": wall - training, "world": result.outcome.extra["world_size"]}


def in_process(rows: int, epochs: int, workdir: Path) -> float:
    from dbspec.seams.compute import COMPUTE
    from dbspec.training.fit import fit_spec

    spec, table, splits, fitted = prepare(rows, epochs, 1, workdir)
    cpu = COMPUTE.get("local").model(kind="local", device="cpu")
    local = spec.model_copy(update={"compute": cpu})
    return fit_spec(local, table, splits, fitted).outcome.samples_per_second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    names = ["in-process (no distributor)", "TorchDistributor, 1 process",
             "TorchDistributor, 2 processes", "DeepSpeed ZeRO-2, 2 processes"]
    results: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        runs = {
            names[0]: lambda: {"samples_per_second": in_process(args.rows, args.epochs,
                                                                workdir)},
            names[1]: lambda: distributed(args.rows, args.epochs, 1, workdir),
            names[2]: lambda: distributed(args.rows, args.epochs, 2, workdir),
            names[3]: lambda: distributed(args.rows, args.epochs, 2, workdir, DEEPSPEED)}
        for repeat in range(args.repeats):
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:
                results[name].append(runs[name]())
                print(f"  #{repeat} {name}: "
                      f"{results[name][-1]['samples_per_second']:,.0f} samples/s", flush=True)

    def median(name: str, key: str = "samples_per_second") -> float:
        return statistics.median(r[key] for r in results[name])

    print(f"{args.rows:,} rows x 100 features, batch 256 per process, {args.epochs} epochs, "
          f"{args.repeats} repeats (best / median)")
    for name in names:
        rates = [r["samples_per_second"] for r in results[name]]
        line = f"  {name:<29} {max(rates):>10,.0f} / {median(name):>10,.0f} samples/s"
        if "overhead" in results[name][0]:
            overheads = [r["overhead"] for r in results[name]]
            line += (f"  launch overhead {min(overheads):.1f} / {median(name, 'overhead'):.1f} s"
                     f" (wall {median(name, 'wall'):.1f} s)")
        print(line)
    print(f"ratio 2 processes / 1 process (medians) = {median(names[2]) / median(names[1]):.2f}x"
          f"; TorchDistributor 1 process / in-process = {median(names[1]) / median(names[0]):.2f}x"
          " (this machine has 2 cores)")

if __name__ == "__main__":
    main()

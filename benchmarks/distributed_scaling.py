"""What do 2 DDP processes buy over 1, and what does launching them cost?

On the synthetic 100-feature two-class data of the monitoring demo (`specs/diabetes_distributed`
-style MLP 100-256-128-1, batch 256 per process), one process: dbspec's in-process training,
then TorchDistributor (gloo, local mode) with 1 and 2 processes. Prints samples/s (summed over
ranks) and the fixed launch overhead (distributor wall time minus the ranks' training time).

The same with DeepspeedTorchDistributor (ZeRO-2, fp32, gloo) for 2 processes.
Run: ``python benchmarks/distributed_scaling.py [--rows 200000] [--epochs 3]``.
"""

from __future__ import annotations

import argparse
import json
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
    from dbspec.data.sources import read_source
    from dbspec.spec import load_spec

    path = workdir / f"scaling-{processes}.yaml"
    path.write_text(SPEC % {"rows": rows, "epochs": epochs, "compute": engine % processes})
    spec = load_spec(str(path)).spec
    table = build_table(read_source(spec.data, base=workdir).frame, spec.data)
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
    from dbspec.training.fit import fit_spec

    from dbspec.spec.sections.compute import LocalCompute

    spec, table, splits, fitted = prepare(rows, epochs, 1, workdir)
    local = spec.model_copy(update={"compute": LocalCompute(kind="local", device="cpu")})
    return fit_spec(local, table, splits, fitted).outcome.samples_per_second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        single = in_process(args.rows, args.epochs, workdir)
        one = distributed(args.rows, args.epochs, 1, workdir)
        two = distributed(args.rows, args.epochs, 2, workdir)
        deepspeed = distributed(args.rows, args.epochs, 2, workdir, DEEPSPEED)
    print(f"{args.rows:,} rows x 100 features, batch 256 per process, {args.epochs} epochs")
    print(f"  in-process (no distributor)   {single:>10,.0f} samples/s")
    for name, result in (("TorchDistributor, 1 process", one),
                         ("TorchDistributor, 2 processes", two),
                         ("DeepSpeed ZeRO-2, 2 processes", deepspeed)):
        print(f"  {name:<29} {result['samples_per_second']:>10,.0f} samples/s  launch overhead "
              f"{result['overhead']:.1f} s (wall {result['wall']:.1f} s)")
    print(f"2 processes / 1 process = {two['samples_per_second'] / one['samples_per_second']:.2f}x"
          f" (this machine has 2 cores)")


if __name__ == "__main__":
    main()

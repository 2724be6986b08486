"""How fast is ``dbspec validate``?

1. Throughput: 1,000 specs (distinct files, varied values, templates included) validated in one
   process with the same code path as the CLI. Target: <= 5 s.
2. Cold start: ``python -m dbspec validate SPEC`` in a fresh process against the bare imports
   of its two dependencies, a fresh ``python -c "import pydantic, yaml"`` (issue 35: jinja2 is
   no longer a dependency of dbspec, so it left the peer, which was ``import pydantic, yaml,
   jinja2``; pydantic's import is lazy, defining a model costs more). The two
   run interleaved (the order alternates each round, so neither always follows the other),
   ``--runs`` times each; min and median of each are printed, wall-clock time and the CPU time
   (user + system) of the child, which other work on the machine disturbs less. Target: the
   ratio of the wall-clock medians <= 2. It is printed last.

dbspec is byte-compiled first, as ``pip install`` does (the floor's libraries already are).

Run: ``python benchmarks/validate_speed.py [--runs 21] [--specs 1000]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "diabetes.yaml"


class Sample(NamedTuple):
    wall: float
    cpu: float


def time_command(argv: list[str]) -> Sample:
    """Wall-clock and CPU time of one fresh process running ``argv``; it must succeed."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, cwd=ROOT)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {child.returncode}")
    return Sample(wall, usage.ru_utime + usage.ru_stime)


def cold_start(runs: int) -> tuple[list[Sample], list[Sample]]:
    python = sys.executable  # the interpreter itself, not a shell shim around it
    # `pip install` byte-compiles a package; an editable checkout under PYTHONDONTWRITEBYTECODE=1
    # (set on these machines) would recompile dbspec's sources on every start instead.
    subprocess.run([python, "-m", "compileall", "-q", str(ROOT / "dbspec")], check=True)
    dbspec = [python, "-m", "dbspec", "validate", str(SPEC)]
    floor = [python, "-c", "import pydantic, yaml"]
    time_command(dbspec), time_command(floor)  # warm the OS file cache
    ours, base = [], []
    for round_ in range(runs):
        if round_ % 2:
            base.append(time_command(floor))
            ours.append(time_command(dbspec))
        else:
            ours.append(time_command(dbspec))
            base.append(time_command(floor))
    return ours, base


def write_specs(directory: Path, count: int) -> list[Path]:
    template = SPEC.read_text()
    paths = []
    for i in range(count):
        text = (template.replace("hidden: 32", f"hidden: {8 + i % 120}")
                .replace("lr: 0.005", f"lr: {0.001 + (i % 50) / 1000:.4f}")
                .replace("epochs: 300", f"epochs: {50 + i}")
                .replace("seed: 42\ncompute", f"seed: {i}\ncompute"))
        path = directory / f"spec_{i:04d}.yaml"
        path.write_text(text)
        paths.append(path)
    return paths


def throughput(count: int) -> tuple[float, int]:
    from dbspec.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        paths = [str(p) for p in write_specs(Path(tmp), count)]
        with contextlib.redirect_stdout(io.StringIO()):
            main(["validate", paths[0]])  # import and build outside the timing
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()) as out:
            status = main(["validate", *paths])
        elapsed = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"validation failed:\n{out.getvalue()[-2000:]}")
    return elapsed, len(paths)


def _line(name: str, samples: list[Sample]) -> str:
    walls, cpus = [s.wall for s in samples], [s.cpu for s in samples]
    return (f"  {name:<40} wall min {min(walls) * 1000:4.0f} ms, median "
            f"{statistics.median(walls) * 1000:4.0f} ms; cpu min {min(cpus) * 1000:4.0f} ms, "
            f"median {statistics.median(cpus) * 1000:4.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--specs", type=int, default=1000)
    args = parser.parse_args()

    if args.specs:
        elapsed, count = throughput(args.specs)
        print(f"throughput: {count} specs (each with its targets: base + dev + prod) in "
              f"{elapsed:.2f} s, {elapsed / count * 1000:.2f} ms per spec (target <= 5 s)")
    ours, base = cold_start(args.runs)
    print(f"cold start, {args.runs} interleaved runs each:")
    print(_line("python -m dbspec validate specs/diabetes.yaml", ours))
    print(_line('python -c "import pydantic, yaml"', base))

    def ratio(pick, of) -> float:
        return of([pick(s) for s in ours]) / of([pick(s) for s in base])

    print(f"  cpu ratio: median {ratio(lambda s: s.cpu, statistics.median):.2f}, "
          f"min {ratio(lambda s: s.cpu, min):.2f}")
    print(f"cold validate / bare import, wall: median "
          f"{ratio(lambda s: s.wall, statistics.median):.2f}, "
          f"min {ratio(lambda s: s.wall, min):.2f} (target: median <= 2)")


if __name__ == "__main__":
    main()

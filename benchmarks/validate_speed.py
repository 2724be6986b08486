"""How fast is ``dbspec validate``?

1. Cold start: ``python -m dbspec validate SPEC`` in a fresh process against the floor every
   pydantic-based validator pays, ``python -c "import pydantic, yaml, jinja2"``. The two are run
   alternately, the median of each is taken, and the ratio printed. Target: <= 2.
2. Throughput: 1,000 specs (distinct files, varied values, templates included) validated in one
   process with the same code path as the CLI. Target: <= 5 s.

dbspec is byte-compiled first, as ``pip install`` does (the floor's libraries already are).

Run: ``python benchmarks/validate_speed.py [--runs 15] [--specs 1000]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "diabetes.yaml"


def time_command(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - start


def cold_start(runs: int) -> tuple[float, float]:
    python = sys.executable  # the interpreter itself, not a shell shim around it
    # `pip install` byte-compiles a package; an editable checkout under PYTHONDONTWRITEBYTECODE=1
    # (set on these machines) would recompile dbspec's sources on every start instead.
    subprocess.run([python, "-m", "compileall", "-q", str(ROOT / "dbspec")], check=True)
    dbspec = [python, "-m", "dbspec", "validate", str(SPEC)]
    floor = [python, "-c", "import pydantic, yaml, jinja2"]
    time_command(dbspec), time_command(floor)  # warm the OS file cache
    ours, base = [], []
    for _ in range(runs):
        ours.append(time_command(dbspec))
        base.append(time_command(floor))
    return statistics.median(ours), statistics.median(base)


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
        main(["validate", paths[0]])  # import and build outside the timing
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()) as out:
            status = main(["validate", *paths])
        elapsed = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"validation failed:\n{out.getvalue()[-2000:]}")
    return elapsed, len(paths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--specs", type=int, default=1000)
    args = parser.parse_args()

    ours, base = cold_start(args.runs)
    print(f"cold validate:  dbspec {ours * 1000:.0f} ms, bare import of pydantic+yaml+jinja2 "
          f"{base * 1000:.0f} ms (medians of {args.runs}); ratio {ours / base:.2f} (target <= 2)")
    elapsed, count = throughput(args.specs)
    print(f"throughput:     {count} specs (each with its targets: base + dev + prod) in "
          f"{elapsed:.2f} s, {elapsed / count * 1000:.2f} ms per spec (target <= 5 s)")


if __name__ == "__main__":
    main()

"""What checking a shard set against its index costs when it is opened (issue 34), against one
pass over its rows (the least a training epoch reads).

    PYTHONPATH=. python benchmarks/shard_check.py [--rows 6000000] [--features 20]
        [--shard-size-mb 32 1] [--dir /tmp/shard-check]

Writes a synthetic set per shard size with the conversion's own writer, then times
``open_shard_set`` (rows from each Arrow file's record batch headers, sizes, the index's
checksum) and one read of every shard (``split_arrays``), each the best of three, warm cache.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np


def write_set(root: Path, rows: int, features: int, shard_size_mb: int):
    import pyarrow as pa

    from dbspec.data.shard_writing import Layout, Origin, convert_batches, finish, partial_dir
    from dbspec.data.shards import shard_rows
    from dbspec.spec.sections.data import DataSpec

    names = [f"x{j}" for j in range(features)]
    data = DataSpec.model_validate({"source": {"kind": "parquet", "path": "none"},
                                    "task": "regression", "target": "y", "features": names,
                                    "streaming": {"enabled": True,
                                                  "shard_size_mb": shard_size_mb}})
    layout = Layout(names, "y", None, True, shard_rows(features, shard_size_mb), data)
    rng = np.random.default_rng(0)

    def batches():
        for start in range(0, rows, 262_144):
            n = min(262_144, rows - start)
            x = rng.normal(size=(n, features)).astype(np.float32)
            yield pa.record_batch([pa.array(x[:, j]) for j in range(features)]
                                  + [pa.array(x.sum(axis=1))], names=names + ["y"])

    directory = partial_dir(root, "bench")
    tally = convert_batches(batches(), layout, directory, part=0)
    return finish(directory, root / f"shards-{shard_size_mb}mb", data, names, tally,
                  Origin(version="bench", uri="bench", identity="bench"))


def best_of(action, times: int = 3) -> float:
    seconds = []
    for _ in range(times):
        started = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - started)
    return min(seconds)


def main() -> None:
    from dbspec.data.shards import SPLITS, open_shard_set
    from dbspec.data.stream import split_arrays

    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=6_000_000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--shard-size-mb", type=int, nargs="+", default=[32, 1])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/shard-check"))
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    try:
        for size in args.shard_size_mb:
            shard_set = write_set(args.dir, args.rows, args.features, size)
            shards = sum(len(shard_set.shards(split)) for split in SPLITS)
            gigabytes = sum(p.stat().st_size for p in shard_set.root.rglob("*.arrow")) / 1e9
            check = best_of(lambda: open_shard_set(shard_set.root))
            read = best_of(lambda: [block for split in SPLITS
                                    for block in split_arrays(shard_set, split)])
            print(f"{args.rows:,} rows x {args.features} features, shard_size_mb {size}: "
                  f"{shards} shards, {gigabytes:.2f} GB; check {check * 1000:.1f} ms, one read "
                  f"of every row {read * 1000:.0f} ms ({check / read:.2%} of it)", flush=True)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()

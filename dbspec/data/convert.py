"""The source of a ``data.streaming`` spec: stream or not, and its conversion into shards.

:func:`decide` says whether the rows stream (``enabled: auto`` compares the feature matrix's
size, from the source's metadata, with the in-memory limit); :func:`convert_source` writes the
shard set once (or finds it), by streaming Arrow batches in this process, or with Spark tasks
converting the source's files in parallel when the Spark executor runs.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from functools import reduce
from itertools import accumulate
from pathlib import Path
from typing import Any, Callable, Optional

from dbspec.data.shard_writing import (Layout, Origin, Tally, check_schema, convert_batches,
                                       finish, partial_dir, record_batches)
from dbspec.data.shards import (BrokenShardSet, ShardSet, open_shard_set, shard_identity,
                                shard_rows)
from dbspec.data.sources import DataError
from dbspec.spec.sections.data import DataSpec


@dataclass(frozen=True)
class Decision:
    """Whether the rows stream, and why, in words for the run's output."""

    stream: bool
    reason: str


def available_memory() -> int:
    """Bytes of memory available to new work: the machine's, or less when this process's
    memory cgroup (a container, a job's slot) leaves less room under its limit."""
    import psutil

    machine = psutil.virtual_memory().available
    room = cgroup_room()
    return machine if room is None else min(machine, room)


def cgroup_room() -> Optional[int]:
    """Bytes left under this process's memory cgroup limit (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``), or None without a limit. Page cache counts in the usage, as
    the kernel counts it; it is reclaimable, so this errs on the side of streaming."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            base, files = Path("/sys/fs/cgroup"), ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory")
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        try:
            limit, usage = ((base / path.lstrip("/") / name).read_text().strip() for name in files)
            if limit != "max" and int(limit) < 2**60:  # else no limit set
                return max(int(limit) - int(usage), 0)
        except (OSError, ValueError):
            continue
    return None


#: The in-memory path's peak memory over its feature matrix, measured with
#: benchmarks/streaming_scale.py (1-2 M rows x 100 float32: 4.1 GB and 8.1 GB peak for 0.4 and
#: 0.8 GB matrices): the table, its pandas frame, the float64 copy preprocessing fits on, the
#: transformed training tensors. ``enabled: auto`` keeps a matrix in memory only while this
#: many times it stays under half the memory available.
IN_MEMORY_PEAK_FACTOR = 10


def decide(data: DataSpec, rows: Optional[int], features: int) -> Decision:
    """Stream or not, for a spec with ``data.streaming``; ``rows`` from the source's metadata
    (None: unknown, e.g. a CSV file)."""
    streaming = data.streaming
    if streaming.enabled is True:
        return Decision(True, "data.streaming.enabled: true")
    if streaming.enabled is False:
        return Decision(False, "data.streaming.enabled: false")
    if streaming.in_memory_limit_mb is not None:
        limit, named = streaming.in_memory_limit_mb * 2**20, "data.streaming.in_memory_limit_mb"
    else:
        limit = available_memory() // (2 * IN_MEMORY_PEAK_FACTOR)
        named = (f"1/{2 * IN_MEMORY_PEAK_FACTOR} of the memory available: the in-memory path "
                 f"peaks near {IN_MEMORY_PEAK_FACTOR}x the feature matrix")
    if rows is None:
        return Decision(True, "the source's size is unknown before reading it")
    size = rows * features * 4
    shape = f"{rows:,} rows x {features} features = {_size(size)} in memory"
    if size > limit:
        return Decision(True, f"{shape} > {_size(limit)} ({named})")
    return Decision(False, f"{shape} <= {_size(limit)} ({named})")


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


@dataclass
class OpenedSource:
    """An Arrow dataset over the source at its pinned version, and what identifies it."""

    dataset: Any
    version: str
    uri: str
    file_format: Any = None  # the dataset's format, for Spark tasks reading single files
    spark_files: bool = True  # whether Spark tasks may convert its files one by one
    root: Optional[str] = None  # what the dataset's file paths are relative to (Delta)
    pins: str = ""  # besides the version, what pins the rows (a Delta table's id)

    def file_path(self, fragment) -> str:
        """A fragment's file as a Spark task opens it: Delta's are relative to the table."""
        if self.root is None or fragment.path.startswith("/") or "://" in fragment.path:
            return fragment.path
        return f"{self.root.rstrip('/')}/{fragment.path}"


def count_rows(opened: OpenedSource) -> Optional[int]:
    """Rows of the source from its metadata (Parquet footers, Delta's log); None for CSV."""
    import pyarrow.dataset as ds

    if isinstance(opened.file_format, ds.CsvFileFormat):
        return None
    return opened.dataset.count_rows()


def convert_source(data: DataSpec, opened: OpenedSource, location: Path, *,
                   limit: Optional[int] = None, spark=None,
                   say: Callable[[str], None] = lambda text: None) -> ShardSet:
    """The source's shard set under ``location`` (which every node sees): found there, or
    written now.

    Args:
        limit: Convert only the first rows (smoke runs).
        spark: A session whose tasks convert the source's files in parallel, or None.

    Raises:
        DataError: the source does not fit the spec (the set is not left behind).
    """
    spark_tasks = spark is not None and opened.spark_files and limit is None
    identity = shard_identity(data, opened.version + (f"-first{limit}" if limit else ""),
                              where=f"{opened.uri}|{opened.pins}",
                              made_by="spark" if spark_tasks else "arrow")
    root = Path(location) / f"shards-{identity}"
    if root.exists():
        try:
            found = open_shard_set(root)
            say(f"  reusing the shards of {opened.version} at {root}")
            return found
        except BrokenShardSet as exc:
            say(f"  {exc.problem}: converting the source again")
            # what cannot be removed is found in place when the new set would replace it
            shutil.rmtree(root, ignore_errors=True)
    features = check_schema(opened.dataset.schema, data)
    layout = Layout(features, data.target, data.streaming.key, data.task == "regression",
                    shard_rows(len(features), data.streaming.shard_size_mb), data)
    directory = partial_dir(Path(location), identity)
    started = time.monotonic()
    try:
        if spark_tasks:
            tally = _convert_on_spark(spark, opened, layout, directory, say)
        else:
            tally = _convert_here(opened, layout, directory, limit, say)
    except BaseException as exc:
        import pyarrow as pa

        shutil.rmtree(directory, ignore_errors=True)
        if isinstance(exc, (pa.ArrowException, OSError)) and not isinstance(exc, DataError):
            raise DataError(f"data.source: cannot convert {opened.uri}: {exc}") from None
        raise
    shard_set = finish(directory, root, data, features, tally,
                       Origin(version=opened.version, uri=opened.uri, identity=identity))
    seconds = time.monotonic() - started
    say(f"  converted {tally.rows:,} rows into {sum(len(v) for v in tally.shards.values())} "
        f"shards in {seconds:.1f} s ({tally.rows / max(seconds, 1e-9):,.0f} rows/s): {root}")
    return shard_set


def _convert_here(opened: OpenedSource, layout: Layout, directory: Path,
                  limit: Optional[int], say: Callable[[str], None]) -> Tally:
    """Stream the source's record batches through this process."""
    batches = record_batches(opened.dataset, layout.columns)
    if limit is not None:
        batches = first_rows(batches, limit)
    told = [time.monotonic()]

    def progress(rows: int) -> None:
        if time.monotonic() - told[0] >= 10:
            told[0] = time.monotonic()
            say(f"  converting: {rows:,} rows")

    return convert_batches(batches, layout, directory, part=0, progress=progress)


def first_rows(batches, limit: int):
    """The first ``limit`` rows of a stream of record batches."""
    left = limit
    for batch in batches:
        if left <= 0:
            return
        yield batch.slice(0, left)
        left -= batch.num_rows


def _convert_on_spark(spark, opened: OpenedSource, layout: Layout, directory: Path,
                      say: Callable[[str], None]) -> Tally:
    """One Spark task per source file: each converts its file into its own shards (row
    positions continue from the files before it, as in the single-process conversion)."""
    fragments = list(opened.dataset.get_fragments())
    offsets = [0, *accumulate(fragment.count_rows() for fragment in fragments)]
    jobs = [(part, opened.file_path(fragment), offsets[part])
            for part, fragment in enumerate(fragments)]
    if not jobs:
        return Tally()
    say(f"  converting {len(jobs)} file(s), {offsets[-1]:,} rows, in Spark tasks")
    file_format, target = opened.file_format, str(directory)
    schema = opened.dataset.schema  # the table's, also for files written before a column came

    def convert_file(job):
        import pyarrow.dataset as pads

        part, path, first_row = job
        try:
            dataset = pads.dataset(path, format=file_format, schema=schema)
            return "ok", convert_batches(record_batches(dataset, layout.columns), layout,
                                         Path(target), part, first_row)
        except DataError as exc:
            return "error", str(exc)
        except Exception as exc:  # carried back in words: Spark would show a Java stack
            return "error", f"data.source: converting {path} failed: {type(exc).__name__}: {exc}"

    results = spark.sparkContext.parallelize(jobs, len(jobs)).map(convert_file).collect()
    errors = [message for status, message in results if status == "error"]
    if errors:
        raise DataError(errors[0])
    return reduce(Tally.merge, (part for _, part in results), Tally())

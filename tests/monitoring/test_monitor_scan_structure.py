"""How a monitoring pass reads: bounded batches whatever the table's row groups, and counts
that are the binary search's exactly (the scan bins by sorting)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import write_deltalake

from dbspec.monitoring.drift import ColumnAccumulator
from dbspec.monitoring.labels import open_rows
from dbspec.monitoring.layout import InferenceRows, read_batches
from dbspec.monitoring.profile import profile_column


def test_a_large_row_group_is_read_a_batch_at_a_time(tmp_path):
    rows = 1_000_000  # one row group: the dataset scanner decodes all of it (30 MiB) at once
    rng = np.random.default_rng(0)
    write_deltalake(tmp_path, pa.table({**{f"x{j}": rng.normal(size=rows) for j in range(4)},
                                        "model_name": pa.array(["m"] * rows)}))
    [data_file] = tmp_path.glob("*.parquet")
    assert pq.ParquetFile(data_file).metadata.num_row_groups == 1
    table = InferenceRows(str(tmp_path), open_rows(str(tmp_path), "open"))
    before, held, seen = pa.total_allocated_bytes(), 0, 0
    for batch in read_batches(table, ["x0", "x1", "x2", "x3", "model_name"],
                              ds.field("model_name") == "m", 1000):
        assert batch.num_rows <= 1000
        held = max(held, pa.total_allocated_bytes() - before)
        seen += batch.num_rows
    assert seen == rows
    decoded = rows * 4 * 8
    assert held < decoded / 2, f"{held / 2**20:.1f} MiB held at once while reading"


def _searched(profile, values):
    """The counts by a binary search per value (what the sorted counts must equal)."""
    present = np.asarray(values, dtype=np.float64)
    present = present[~np.isnan(present)]
    fine = np.bincount(np.searchsorted(profile["fine_edges"], present, side="right"),
                       minlength=len(profile["fine_edges"]) + 1)
    coarse = np.bincount(np.searchsorted(profile["edges"], present, side="right"),
                         minlength=len(profile["edges"]) + 1)
    outside = np.count_nonzero((present < profile["min"]) | (present > profile["max"]))
    return fine.tolist(), coarse.tolist(), int(outside), len(values) - len(present)


def test_sorted_counts_equal_a_binary_search_also_on_the_edges_in_float32():
    rng = np.random.default_rng(3)
    profile = profile_column(rng.normal(size=500))
    edges = np.asarray([profile["min"], profile["max"], *profile["fine_edges"]])
    for dtype in (np.float32, np.float64):
        values = (rng.normal(size=5000) * 1.5).astype(dtype)
        near = edges.astype(dtype)  # on each edge and a float below it, as the server rounds
        values[:2 * len(edges)] = np.concatenate([near, np.nextafter(near, dtype(-np.inf))])
        values[-4:] = [np.nan, np.inf, -np.inf, np.nan]
        counted = ColumnAccumulator(profile)
        counted.update(values[:1234])
        counted.update(values[1234:])
        assert (counted.fine_counts.tolist(), counted.counts.tolist(), counted.outside,
                counted.missing) == _searched(profile, values), dtype

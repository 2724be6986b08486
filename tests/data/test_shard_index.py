"""A shard set's index checked against its shard files (issue 34): an index that under- or
over-reports a shard's rows, a shard of another size, an index edited or garbled since it was
written. Opening the set refuses it with the shard and both counts; converting the source
again replaces it.

Real Delta tables and shard sets in ``tmp_path``; the index is edited as a person or a broken
copy would edit it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dbspec.data.shards import BrokenShardSet, open_shard_set
from tests.data.test_streaming import convert, data_spec, rows_table, stream_set, write_delta


def edit_index(root: Path, change) -> dict:
    """Apply ``change`` to the set's index.json (a dict, changed in place); returns it."""
    path = root / "index.json"
    index = json.loads(path.read_text())
    change(index)
    path.write_text(json.dumps(index))
    return index


def first_train_shard(index: dict) -> dict:
    return index["splits"]["train"][0]


def set_rows(rows: int):
    return lambda index: first_train_shard(index).update(rows=rows)


@pytest.mark.parametrize("claimed", [100, 1_000_000])
def test_an_index_that_misreports_a_shards_rows_is_refused_naming_it(tmp_path, claimed):
    shard_set = stream_set(tmp_path)  # shards of 400 rows
    index = edit_index(shard_set.root, set_rows(claimed))
    name = first_train_shard(index)["file"]
    message = (f"the shard set at {shard_set.root} does not match its index.json: shard "
               f"{name} holds 400 rows, the index says {claimed:,}; convert the source again")
    with pytest.raises(BrokenShardSet, match=re.escape(message)):
        open_shard_set(shard_set.root)


def test_a_shard_of_another_size_is_refused_naming_it(tmp_path):
    """A shard replaced by another Arrow file of as many rows (a shard of another set)."""
    import pyarrow as pa

    shard_set = stream_set(tmp_path)
    path, _ = shard_set.shards("train")[0]
    size = path.stat().st_size
    with pa.memory_map(str(path)) as source:
        table = pa.ipc.open_file(source).read_all()
    table = table.append_column("extra", table.column("y"))
    with pa.ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    found = path.stat().st_size
    name = path.relative_to(shard_set.root).as_posix()
    with pytest.raises(BrokenShardSet, match=re.escape(
            f"shard {name} has {found:,} bytes, the index says {size:,}")):
        open_shard_set(shard_set.root)


def test_a_truncated_shard_is_refused_naming_it(tmp_path):
    shard_set = stream_set(tmp_path)
    path, _ = shard_set.shards("validation")[0]
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(BrokenShardSet, match=re.escape(
            f"cannot read shard {path.relative_to(shard_set.root).as_posix()}")):
        open_shard_set(shard_set.root)


def test_an_index_changed_since_it_was_written_is_refused(tmp_path):
    shard_set = stream_set(tmp_path)
    edit_index(shard_set.root, lambda index: index.update(feature_names=["b", "a", "ident"]))
    with pytest.raises(BrokenShardSet, match="has an index.json changed since it was written"):
        open_shard_set(shard_set.root)


@pytest.mark.parametrize("text", ["garbage", "[]", '{"format": "dbspec-arrow-shards", '
                                                   '"format_version": 3, "splits": 1}'])
def test_a_garbled_index_is_refused(tmp_path, text):
    shard_set = stream_set(tmp_path)
    (shard_set.root / "index.json").write_text(text)
    with pytest.raises(BrokenShardSet, match="has (no readable|a damaged) index.json"):
        open_shard_set(shard_set.root)


@pytest.mark.parametrize("change", [set_rows(100), set_rows(1_000_000), "garbage"],
                         ids=["under-reported", "over-reported", "garbage"])
def test_converting_again_replaces_a_broken_set_and_says_so(tmp_path, change):
    data = data_spec(write_delta(tmp_path / "table", rows_table(3000)))
    first = convert(data, tmp_path / "shards")
    if change == "garbage":
        (first.root / "index.json").write_text("garbage")
    else:
        edit_index(first.root, change)
    said: list[str] = []
    again = convert(data, tmp_path / "shards", say=said.append)
    assert again.root == first.root and again.index == first.index
    assert sum(again.rows(split) for split in ("train", "validation", "test")) == 3000
    assert any(line.startswith(f"  the shard set at {first.root} ") and
               line.endswith(": converting the source again") for line in said), said
    assert any(line.startswith("  converted 3,000 rows") for line in said), said
    assert [p.name for p in (tmp_path / "shards").iterdir()] == [first.root.name]

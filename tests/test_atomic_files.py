"""dbspec's one atomic file write (dbspec.atomic.atomic_file / write_atomic): whole or not at
all, no partial file left behind, concurrent writers of one path each land whole."""

from __future__ import annotations

import threading

import pytest

from dbspec.atomic import atomic_file, write_atomic


def test_a_write_replaces_the_file_whole(tmp_path):
    target = tmp_path / "state.json"
    write_atomic(target, '{"a": 1}')
    write_atomic(target, b'{"a": 2}', durable=False)
    assert target.read_bytes() == b'{"a": 2}'
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_an_error_inside_the_block_keeps_the_old_file_and_leaves_nothing(tmp_path):
    target = tmp_path / "model.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_file(target) as handle:
            handle.write(b"half of the new")
            raise RuntimeError("boom")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.bin"]


def test_concurrent_writers_each_land_whole(tmp_path):
    target = tmp_path / "shared.txt"
    bodies = [str(i) * 100_000 for i in range(8)]
    threads = [threading.Thread(target=write_atomic, args=(target, body)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert target.read_text() in bodies
    assert [p.name for p in tmp_path.iterdir()] == ["shared.txt"]


def test_leftovers_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    import subprocess

    from dbspec.atomic import remove_partial_files

    target = tmp_path / "out.bin"
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = tmp_path / f".out.bin.{dead.pid}-0123abcd.partial"
    live = tmp_path / ".out.bin.1-0123abcd.partial"  # pid 1 never dies
    for path in (left, live):
        path.write_bytes(b"half")
    assert remove_partial_files(target) == [left]
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name]

"""dbspec's one file lock (dbspec.filelocks): refusals name the holder, waits are bounded,
threads of one process exclude each other, a dead holder is told to the next one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from dbspec.filelocks import HostLock, LockBusy, describe_holder


def test_a_held_lock_is_refused_with_its_holder_after_the_wait(tmp_path):
    path = tmp_path / "x.lock"
    with HostLock(path).acquire("the x lock"):
        started = time.monotonic()
        with pytest.raises(LockBusy) as busy:
            HostLock(path).acquire("the x lock", wait=0.3)
        waited = time.monotonic() - started
    assert 0.25 <= waited < 5
    assert busy.value.holder["pid"] == os.getpid()
    assert str(busy.value) == (f"the x lock is held by pid {os.getpid()} on host "
                               f"{socket.gethostname()} since {busy.value.holder['started']}")
    again = HostLock(path).acquire("the x lock")  # released by the with block
    assert again.previous is None
    again.release()
    again.release()  # twice is harmless
    assert path.read_text() == ""  # a clean end leaves no holder's name


def test_threads_of_one_process_exclude_each_other(tmp_path):
    inside, overlaps = [], []

    def worker() -> None:
        with HostLock(tmp_path / "t.lock").acquire("t", wait=30):
            if inside:
                overlaps.append(1)
            inside.append(1)
            time.sleep(0.02)
            inside.pop()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not overlaps


def test_a_killed_holder_frees_the_lock_and_is_named_to_the_next(tmp_path):
    path = tmp_path / "k.lock"
    code = ("import sys, time; from dbspec.filelocks import HostLock; "
            f"held = HostLock({str(path)!r}).acquire('k'); print('held', flush=True); "
            "time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockBusy, match=f"pid {holder.pid} on host"):
            HostLock(path).acquire("k")
    finally:
        holder.kill()
        holder.wait()
    taken = HostLock(path).acquire("k", wait=5)
    assert taken.previous["pid"] == holder.pid
    taken.release()


def test_a_half_written_holder_is_a_process_just_starting(tmp_path):
    assert describe_holder({}) == "a process that is just starting"
    path = tmp_path / "h.lock"
    path.write_text('{"pid": 1')  # a holder's first instants: its name half-written
    lock = HostLock(path).acquire("h")
    assert lock.previous is None
    assert json.loads(path.read_text())["pid"] == os.getpid()
    lock.release()

"""Iterate a slow producer in a background thread, a few items ahead of the consumer."""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from threading import current_thread
from typing import Iterable, Iterator


def read_ahead(batches: Iterable, depth: int = 2, name: str = "dbspec-read-ahead") -> Iterator:
    """``batches`` produced by a background thread, ``depth`` ahead (the conversion's reader
    decodes the next batch while this one is converted; the stream's prefetch prepares the next
    window while this one trains); an error there is raised here, and closing this iterator
    stops the thread."""
    items, end = iter(batches), object()
    # one worker: the items are made in order, one at a time, as the iterator needs
    pool = ThreadPoolExecutor(1, initializer=lambda: setattr(current_thread(), "name", name))
    try:
        pending = deque(pool.submit(next, items, end) for _ in range(depth))
        while (item := pending.popleft().result()) is not end:
            pending.append(pool.submit(next, items, end))
            yield item
    finally:
        pool.shutdown(wait=True, cancel_futures=True)

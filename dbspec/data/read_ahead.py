"""Iterate a slow producer in a background thread, a few items ahead of the consumer."""

from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator


def read_ahead(batches: Iterable, depth: int = 2, name: str = "dbspec-read-ahead") -> Iterator:
    """``batches`` produced by a background thread, ``depth`` ahead (the conversion's reader
    decodes the next batch while this one is converted; the stream's prefetch prepares the next
    window while this one trains); an error there is raised here, and closing this iterator
    stops the thread."""
    box: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def produce() -> None:
        try:
            for batch in batches:
                while not stop.is_set():
                    try:
                        box.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            box.put(end)
        except BaseException as exc:  # raised in the caller
            box.put(exc)

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = box.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            try:
                box.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=0.05)


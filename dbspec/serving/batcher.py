"""Dynamic micro-batching for the scoring endpoint: requests merged into forward passes.

A request that arrives while others are still being read waits for them — up to
``max_wait_ms`` and ``max_batch_size`` rows — so a lone request is scored at once and a busy
server runs few, large batches. Forward passes run on the event loop while they are quick (a
small MLP takes tens of microseconds, less than a thread hand-off); once they average over 2 ms
they move to a worker thread so the loop keeps reading.
"""

from __future__ import annotations

import asyncio
import sys
import time
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple, Optional

import numpy as np

from dbspec.models.card import prediction_columns
from dbspec.serving.protocol import RequestError, check_finite_predictions

if TYPE_CHECKING:
    from dbspec.serving.app import LoadedModel, ScoringApp

_SLOW_FORWARD_S = 0.002


class _Pending(NamedTuple):
    x: np.ndarray
    future: asyncio.Future
    model: LoadedModel


class Batcher:
    """Merges submitted feature matrices into forward passes (see the module docstring)."""

    def __init__(self, app: "ScoringApp", max_rows: int, max_wait_s: float):
        self.app = app
        self.max_rows = max_rows
        self.max_wait_s = max_wait_s
        self.pending: deque[_Pending] = deque()
        self.rows = 0
        self.closing = False
        self._wake: Optional[asyncio.Future] = None
        self._filling = False
        self._forward_s = 0.0
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="dbspec-forward")

    def submit(self, x: np.ndarray, model: LoadedModel) -> asyncio.Future:
        """Queue ``x`` for ``model``; the future gets (prediction columns, start, stop)."""
        future = asyncio.get_running_loop().create_future()
        self.pending.append(_Pending(x, future, model))
        self.rows += len(x)
        self.poke()
        return future

    def poke(self) -> None:
        """Wake the runner when what it waits for has happened."""
        wake = self._wake
        if wake is None or wake.done():
            return
        if self.closing or self.pending and (not self._filling or self.rows >= self.max_rows
                                             or self.app.arriving == 0):
            wake.set_result(None)

    async def _wait(self, timeout: Optional[float]) -> None:
        loop = asyncio.get_running_loop()
        self._wake = loop.create_future()
        timer = loop.call_later(timeout, _settle, self._wake) if timeout else None
        try:
            await self._wake
        finally:
            self._wake = None
            if timer is not None:
                timer.cancel()

    async def run(self) -> None:
        while True:
            if not self.pending:
                if self.closing:
                    return
                self._filling = False
                await self._wait(None)
                continue
            if self.rows < self.max_rows and self.app.arriving > 0 and self.max_wait_s > 0:
                self._filling = True
                await self._wait(self.max_wait_s)
                self._filling = False
            await self._score(self._take())

    def close(self) -> None:
        self.closing = True
        self.poke()

    def _take(self) -> list[_Pending]:
        first = self.pending.popleft()
        batch, rows = [first], len(first.x)
        while self.pending and self.pending[0].model is first.model and \
                rows + len(self.pending[0].x) <= self.max_rows:
            item = self.pending.popleft()
            batch.append(item)
            rows += len(item.x)
        self.rows -= rows
        return batch

    async def _score(self, batch: list[_Pending]) -> None:
        loaded = batch[0].model
        x = batch[0].x if len(batch) == 1 else np.concatenate([p.x for p in batch])
        started = time.perf_counter()
        try:
            if self._forward_s > _SLOW_FORWARD_S:
                out = await asyncio.get_running_loop().run_in_executor(
                    self._executor, forward, loaded.model, x)
            else:
                out = forward(loaded.model, x)
            columns = prediction_columns(loaded.model.card, out)
        except Exception as exc:  # a model that fails on valid input: report, keep serving
            traceback.print_exc(file=sys.stderr)
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(RequestError(500, f"the model failed: {exc}"))
            return
        self._forward_s = 0.8 * self._forward_s + 0.2 * (time.perf_counter() - started)
        finite = bool(np.isfinite(out).all())
        offset = 0
        for item in batch:
            stop = offset + len(item.x)
            if not item.future.done():
                try:
                    if not finite:  # only the requests holding the overflowing rows fail
                        check_finite_predictions(out, offset, stop)
                    item.future.set_result((columns, offset, stop))
                except RequestError as refused:
                    item.future.set_exception(refused)
            offset = stop
        self.app.metrics.batch(len(batch), len(x))


def forward(model, x: np.ndarray) -> np.ndarray:
    """The model's outputs for the rows ``x``, without autograd for a torch model."""
    if model_runtime(model) != "torch":  # scores numpy rows itself
        return model(x)
    import torch  # loaded with the model already

    with torch.inference_mode():
        return model(torch.from_numpy(x)).numpy()


def model_runtime(model) -> str:
    """``onnxruntime <version>`` (:mod:`dbspec.serving.onnx_model`), else ``torch``."""
    return getattr(model, "runtime", "torch")


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)

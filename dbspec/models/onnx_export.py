"""A served model exported to ONNX, so ``dbspec serve`` scores it with ONNX Runtime, without
torch (:mod:`dbspec.serving.onnx_model`).

The whole :class:`~dbspec.models.served.ServedModel` (float32 rows in training column order ->
predictions) is exported with ``torch.onnx``'s ``torch.export``-based exporter and a dynamic
batch axis; typed features are encoded before the graph, in numpy. A network the exporter cannot
trace (a custom class branching on values), a graph that disagrees with torch on check rows, or
a missing ``onnx``/``onnxscript``/``onnxruntime`` leaves the model without ``model.onnx``:
it is served with torch.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np
import torch

from dbspec.models.card import ONNX_FILE, ONNX_INPUT, ONNX_OUTPUT

if TYPE_CHECKING:  # served.py imports this module when it saves a model
    from dbspec.models.served import ServedModel

#: How far the graph's predictions may lie from torch's on the check rows: float32 rounding
#: of sums taken in another order, not a different function.
RTOL = 1e-4

_LOG = logging.getLogger("dbspec.model")
#: Loggers that report every step of an export (passes, folding) at INFO and WARNING
_CHATTY = ("torch", "onnxscript", "onnx_ir")


def export_onnx(model: ServedModel, directory: Path) -> Optional[Path]:
    """Write ``model`` (a served model) as ``directory/model.onnx``; the file, or None (and a
    line on the ``dbspec.model`` logger saying why) when it is served with torch instead.

    The exported graph is checked against the torch module on a few rows before it is kept.
    """
    target = Path(directory) / ONNX_FILE
    target.unlink(missing_ok=True)  # a stale graph must never stand in for new weights
    try:
        import onnxruntime  # noqa: F401  (the check below needs it; so does serving it)
        import onnxscript  # noqa: F401  (torch.onnx's exporter needs it)
    except ImportError as exc:
        _LOG.info("not exported to ONNX (%s; pip install 'dbspec[train]'): served with torch",
                  exc.name)
        return None
    width = len(model.card.feature_names)
    training = model.training
    model.eval()
    try:
        graph = _export(model, width)
        problem = _mismatch(model, graph, _check_rows(model.card, width))
    except Exception as exc:  # whatever the exporter trips on, torch still serves the model
        _LOG.info("not exported to ONNX (%s): served with torch", _first_line(exc))
        return None
    finally:
        model.train(training)
    if problem:
        _LOG.warning("the ONNX export differs from the torch module (%s): served with torch",
                     problem)
        return None
    target.write_bytes(graph)
    return target


def _export(model: torch.nn.Module, width: int) -> bytes:
    """The serialized ONNX model; the exporter's progress lines and warnings are silenced."""
    example = torch.zeros(3, width)
    batch = torch.export.Dim("batch", min=1)
    loggers = [logging.getLogger(name) for name in _CHATTY]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(model, (example,), dynamo=True, input_names=[ONNX_INPUT],
                                        output_names=[ONNX_OUTPUT], dynamic_shapes=({0: batch},),
                                        verbose=False)
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
    if program is None:
        raise RuntimeError("the exporter returned no program")
    return program.model_proto.SerializeToString()


def _check_rows(card, width: int) -> np.ndarray:
    """Rows the graph must score as torch does: zeros, ones, and (when the card has them) each
    feature's training low, high and midpoint; one row alone is checked too."""
    rows = [np.zeros(width), np.ones(width)]
    ranges = card.feature_ranges or {}
    if len(ranges.get("low") or ()) == width and len(ranges.get("high") or ()) == width:
        low, high = (np.asarray(ranges[k], dtype=np.float64) for k in ("low", "high"))
        rows += [low, high, (low + high) / 2]
    return np.nan_to_num(np.stack(rows)).astype(np.float32)


def _mismatch(model: torch.nn.Module, graph: bytes, rows: np.ndarray) -> Optional[str]:
    """Why the graph's predictions are not torch's on ``rows`` (and on the first row alone);
    None when they agree."""
    import onnxruntime

    session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
    for x in (rows, rows[:1]):
        with torch.inference_mode():
            expected = model(torch.from_numpy(x)).numpy()
        got = session.run([ONNX_OUTPUT], {ONNX_INPUT: x})[0]
        if got.shape != expected.shape:
            return f"output shape {got.shape}, torch's {expected.shape}"
        scale = max(1.0, float(np.nanmax(np.abs(expected), initial=0.0)))
        if not np.allclose(got, expected, rtol=RTOL, atol=RTOL * scale, equal_nan=True):
            return f"largest difference {float(np.nanmax(np.abs(got - expected))):.3g}"
    return None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]

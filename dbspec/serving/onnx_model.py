"""A served model scored by ONNX Runtime, for ``dbspec serve``: torch (over a second of start,
about 190 MB) is never imported.

A model logged by dbspec carries ``model.onnx`` (:mod:`dbspec.models.onnx_export`):
preprocessing, network and output head in one graph, float32 rows in training column order in.
Without the file, or without ``onnxruntime``, the torch module serves it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from dbspec.models.card import ONNX_FILE, ONNX_INPUT, ONNX_OUTPUT, ModelCard, read_card
from dbspec.registry.errors import RegistryError

#: Threads per request batch: requests are small and the server batches them; more threads
#: only contend with the event loop (the torch path runs one too).
THREADS = 1


class OnnxServedModel:
    """Float32 rows in training column order -> predictions, as the torch served model;
    ``runtime`` (``onnxruntime <version>``) is what ``GET /version`` reports."""

    def __init__(self, card: ModelCard, session, runtime: str):
        self.card = card
        self.runtime = runtime
        self._session = session

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self._session.run([ONNX_OUTPUT], {ONNX_INPUT: x})[0]


def load_onnx_model(directory: Path) -> Optional[OnnxServedModel]:
    """The model in ``directory`` on ONNX Runtime; None without ``model.onnx`` or onnxruntime.

    Raises:
        RegistryError: ONNX Runtime cannot load ``model.onnx`` (a damaged artifact).
    """
    path = Path(directory) / ONNX_FILE
    if not path.is_file():
        return None
    try:
        import onnxruntime
    except ImportError:
        return None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = THREADS
    try:
        session = onnxruntime.InferenceSession(str(path), options,
                                               providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own exception types are not a public module
        raise RegistryError(f"{path}: ONNX Runtime cannot load this model "
                            f"({str(exc).strip().splitlines()[0][:200]}); log the model "
                            "again (dbspec run)") from None
    return OnnxServedModel(read_card(directory), session,
                           f"onnxruntime {onnxruntime.__version__}")

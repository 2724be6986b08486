"""A served model scored by ONNX Runtime, for ``dbspec serve``: torch is never imported.

Importing torch costs ``dbspec serve`` over a second of its start and about 190 MB of memory.
A model logged by dbspec carries its network exported to ONNX (``model.onnx``, written by
:mod:`dbspec.models.onnx_export` when the model is logged): preprocessing, network and output
head in one graph, raw float32 rows in training column order in, predictions out. Encoding
typed features into those rows and naming the output columns stay the served model's numpy
code (:func:`dbspec.models.encoding.model_matrix`, :func:`dbspec.models.card.prediction_columns`).

A model logged without the file (its network could not be exported), or a server without
``onnxruntime``, is scored by the torch module (:func:`load_onnx_model` returns None).
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
    """Float32 rows in training column order -> predictions, as the torch served model.

    Attributes:
        card: The model's card.
        runtime: ``onnxruntime <version>``, as ``GET /version`` reports it.
    """

    def __init__(self, card: ModelCard, session, runtime: str):
        self.card = card
        self.runtime = runtime
        self._session = session

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Score a float32 matrix of rows; float32 predictions."""
        return self._session.run([ONNX_OUTPUT], {ONNX_INPUT: x})[0]


def load_onnx_model(directory: Path) -> Optional[OnnxServedModel]:
    """The model in ``directory`` (``model.json``, ``model.onnx``) on ONNX Runtime, or None
    when it has no ``model.onnx`` or ``onnxruntime`` is not installed (torch serves it).

    Raises:
        RegistryError: ``model.onnx`` is there but ONNX Runtime cannot load it (a damaged or
            truncated artifact).
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

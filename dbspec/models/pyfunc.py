"""The MLflow pyfunc face of a served model (``mlflow.pyfunc.load_model``, ``mlflow models serve``).

Logged as "models from code": MLflow runs this file on load, so no pickled object travels. The
dbspec modules it imports (:func:`dbspec.models.portable.served_modules`) and a ``model.custom``
class's module travel as code paths, which MLflow puts first on ``sys.path`` before
:meth:`DbspecPyfuncModel.load_context` runs.

Under MLflow's scoring server (``mlflow models serve``, Databricks Model Serving), which exists
only to answer requests:

- ``predict`` returns a list of ``{column: value}`` records, not a DataFrame: the server
  serialises either the same way, and the frame cost more than the network (pandas 3).
- The heap is collected once after loading, then frozen (:func:`gc.freeze`): the ~300,000
  objects of the import graph live as long as the process, and each full collection walked
  them (~0.4 s, a stall for every request in flight). Not done elsewhere (a notebook, a Spark
  worker): there it would keep the user's cyclic garbage of load-time objects alive.
"""

from __future__ import annotations

import gc
import inspect
import logging
import os

import mlflow.pyfunc
import pandas as pd

_LOG = logging.getLogger("dbspec.model")
#: set by MLflow's scoring app once the model is loaded (and around MLflow's own simulations
#: of serving: ``mlflow models predict``, the input-example check of ``log_model``)
_SERVING_FLAG = "_MLFLOW_IS_IN_SERVING_ENVIRONMENT"
#: set by MLflow (``scoring_server.get_cmd``) for the server process it starts: the model to load
_SERVER_MODEL = "__pyfunc_model_path__"


class DbspecPyfuncModel(mlflow.pyfunc.PythonModel):
    """Scores raw feature rows with a :class:`ServedModel`: named columns by name, unnamed ones
    by position (:func:`dbspec.models.inputs.feature_matrix`). Rows far outside the training
    range follow the spec's ``serving.out_of_range``, logged as the model's ``model_config``
    (:func:`out_of_range_config`): ``warn`` scores them and logs a warning on the
    ``dbspec.model`` logger, ``reject`` refuses the whole input, ``off`` does not check.
    """

    def load_context(self, context) -> None:
        import torch

        from dbspec.models.inputs import DEFAULT_TOLERANCE, FeatureRanges, InputError
        from dbspec.models.served import load_served_model

        torch.set_num_threads(1)  # one request is small; threads only add contention
        self.model = load_served_model(context.artifacts["served_model"])
        # a model logged before the setting travelled (no model_config) warns, as it did
        given = (getattr(context, "model_config", None) or {}).get("out_of_range", {})
        action = given.get("action", "warn")
        if action not in ("warn", "reject", "off"):
            raise InputError(f"model_config: out_of_range.action is {action!r}; expected warn, "
                             "reject or off")
        self.reject = action == "reject"
        self.ranges = None if action == "off" else \
            FeatureRanges.of_card(self.model.card, float(given.get("tolerance", DEFAULT_TOLERANCE)))
        if in_scoring_server():
            gc.collect()  # what is garbage now must not be frozen with the rest
            gc.freeze()

    def predict(self, context, model_input: pd.DataFrame, params=None):
        """Predictions for ``model_input``: a DataFrame with the columns of
        :func:`~dbspec.models.served.prediction_columns`, or, answering a scoring server, the
        same rows as records (``DataFrame.to_dict(orient="records")``)."""
        from dbspec.models.encoding import model_matrix
        from dbspec.models.inputs import RAW_FEATURES, InputError

        try:
            x = model_matrix(self.model.card, model_input)
        except InputError as exc:
            raise _refusal(exc) from None
        outside = self.ranges.outside(x) if self.ranges is not None else None
        if outside and self.reject:
            raise _refusal(InputError(
                f"{len(outside.rows)} of {len(x)} row(s) lie far outside the model's training "
                "range (serving.out_of_range: reject): " + "; ".join(outside.messages(x))
                + f". {RAW_FEATURES}")) from None
        if outside:
            _LOG.warning("%d of %d row(s) lie far outside the model's training range (are the "
                         "features raw, as in training, and not scaled twice?): %s",
                         len(outside.rows), len(x), "; ".join(outside.messages(x)))
        if answering_a_server():
            return prediction_records(self.model, x)
        return self.model.predict_matrix(x)  # x is checked and converted once


def out_of_range_config(action: str, tolerance: float) -> dict:
    """The ``model_config`` a model is logged with: the spec's ``serving.out_of_range``."""
    return {"out_of_range": {"action": action, "tolerance": tolerance}}


def _refusal(exc: Exception) -> Exception:
    """``exc`` as raised to the caller; answering MLflow's scoring server, an MlflowException,
    which it answers with its own status (400 here) and the message (any other exception
    becomes a generic "unexpected error")."""
    if not answering_a_server():
        return exc
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    return MlflowException(str(exc), error_code=INVALID_PARAMETER_VALUE)


def in_scoring_server() -> bool:
    """Whether this process is a scoring server MLflow started to serve a model."""
    return bool(os.environ.get(_SERVER_MODEL))


def answering_a_server() -> bool:
    """Whether MLflow will serialise what ``predict`` returns straight into a response."""
    return os.environ.get(_SERVING_FLAG, "").strip().lower() in ("true", "1")


def prediction_records(model, x) -> list[dict]:
    """What ``model.predict_matrix(x).to_dict(orient="records")`` returns, without pandas."""
    columns = model.predict_columns(x)
    rows = zip(*(values.tolist() for values in columns.values()))
    return [dict(zip(columns, row)) for row in rows]


# MLflow's PythonModel wrapper reads predict's signature on every request (inspect.signature,
# unwrapping MLflow's own validation wrapper each time); one given as __signature__ is used as is
DbspecPyfuncModel.predict.__signature__ = inspect.signature(DbspecPyfuncModel.predict)
mlflow.models.set_model(DbspecPyfuncModel())

"""The MLflow pyfunc face of a served model (``mlflow.pyfunc.load_model``, ``mlflow models serve``).

Logged as "models from code": MLflow stores this file with the model and runs it on load, so
no pickled object travels with the model. The dbspec modules this file imports (transitively,
:func:`dbspec.models.portable.served_modules`) travel as a code path, and so does the module of
a ``model.custom`` class (:mod:`dbspec.models.portable`): MLflow puts
the model's ``code/`` first on ``sys.path`` before :meth:`DbspecPyfuncModel.load_context` runs,
so the network is rebuilt from the copies that travelled, with no ``PYTHONPATH`` to set.
"""

from __future__ import annotations

import logging

import mlflow.pyfunc
import pandas as pd

_LOG = logging.getLogger("dbspec.model")


class DbspecPyfuncModel(mlflow.pyfunc.PythonModel):
    """Scores raw feature rows with a :class:`ServedModel`: named columns by name, unnamed ones
    by position (:func:`dbspec.models.inputs.feature_matrix`). Rows far outside the training
    range are scored and logged as a warning on the ``dbspec.model`` logger.
    """

    def load_context(self, context) -> None:
        import torch

        from dbspec.models.inputs import FeatureRanges
        from dbspec.models.served import load_served_model

        torch.set_num_threads(1)  # one request is small; threads only add contention
        self.model = load_served_model(context.artifacts["served_model"])
        self.ranges = FeatureRanges.of_card(self.model.card)

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from dbspec.models.inputs import feature_matrix

        x = feature_matrix(self.model.card.feature_names, model_input)
        outside = self.ranges.outside(x) if self.ranges is not None else None
        if outside:
            _LOG.warning("%d of %d row(s) lie far outside the model's training range (are the "
                         "features raw, as in training, and not scaled twice?): %s",
                         len(outside.rows), len(x), "; ".join(outside.messages(x)))
        return self.model.predict_matrix(x)  # x is checked and converted once


mlflow.models.set_model(DbspecPyfuncModel())

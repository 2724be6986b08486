"""The MLflow pyfunc face of a served model (``mlflow.pyfunc.load_model``, ``mlflow models serve``).

Logged as "models from code": MLflow stores this file with the model and runs it on load, so
no pickled object travels with the model. The dbspec package itself travels as a code path,
and so does the module of a ``model.custom`` class (:mod:`dbspec.models.portable`): MLflow puts
the model's ``code/`` first on ``sys.path`` before :meth:`DbspecPyfuncModel.load_context` runs,
so the network is rebuilt from the copies that travelled, with no ``PYTHONPATH`` to set.
"""

from __future__ import annotations

import mlflow.pyfunc
import pandas as pd


class DbspecPyfuncModel(mlflow.pyfunc.PythonModel):
    """Scores a DataFrame of raw feature columns with a :class:`ServedModel`."""

    def load_context(self, context) -> None:
        import torch

        from dbspec.models.served import load_served_model

        torch.set_num_threads(1)  # one request is small; threads only add contention
        self.model = load_served_model(context.artifacts["served_model"])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        return self.model.predict_frame(model_input)


mlflow.models.set_model(DbspecPyfuncModel())

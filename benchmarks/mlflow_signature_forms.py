"""Which signature lets ``mlflow models serve`` score 10 numeric features cheaply *and* safely?

Issue 35's row "dbspec model under ``mlflow models serve``" asks for the plain ``mlflow.pytorch``
model's speed, and the plain model's speed comes from its tensor signature. This script measures
MLflow's own side of that choice, with no dbspec in it: a probe pyfunc that scores
``sum((i + 1) * feature_i)`` is saved once per candidate signature of the 10 diabetes features,
and each request body the course and Databricks Model Serving send goes through MLflow's
scoring handler in this process (``mlflow.pyfunc.scoring_server.invocations``: parsing, schema
enforcement, ``predict``, the JSON answer; no HTTP, so the figures hold still on a busy machine).

The probe reads named input by name and unnamed input by position, as dbspec's pyfunc does, so
each cell says what MLflow hands a model for that body:

- ``ok NNN us``: scored right; the median handler time per request;
- ``MISSCORED``: answered 200 with a wrong number: the body names its columns in another order
  than training and MLflow passed the values on without their names (silent misscoring);
- ``refused``: MLflow answered with an error before the model ran.

A signature fit to serve dbspec models scores every positional and every named body right; the
last line prints the cheapest such signature's ``inputs`` cost over the tensor signature's (the
plain model's). ``<= 1.0`` would mean a signature alone meets the goal.
Run: ``python benchmarks/mlflow_signature_forms.py [--requests 400]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _serving_setup as setup
import mlflow.pyfunc
import numpy as np
from mlflow.models import ModelSignature
from mlflow.pyfunc import scoring_server
from mlflow.types import ColSpec, Schema, TensorSpec

REFUSED, MISSCORED = float("inf"), float("nan")  # a cell's cost when it was not scored right


class ProbeModel(mlflow.pyfunc.PythonModel):
    """``sum((i + 1) * x_i)`` over the features: by name where the input has names, else by
    position; a wrong column order shows as a wrong number."""

    def __init__(self, names: list[str]):
        self.names = names

    def predict(self, context, model_input, params=None):
        import pandas as pd

        if isinstance(model_input, dict):
            x = np.column_stack([np.asarray(model_input[n], dtype=float) for n in self.names])
        elif isinstance(model_input, pd.DataFrame) and set(self.names) <= set(model_input):
            x = model_input[self.names].to_numpy(dtype=float)
        else:
            x = np.asarray(model_input, dtype=float).reshape(-1, len(self.names))
        return (x @ np.arange(1, len(self.names) + 1, dtype=float)).tolist()


def signatures(names: list[str]) -> dict[str, Schema]:
    """The candidates: column or tensor specs, unnamed (positional) or one per feature."""
    f64 = np.dtype("float64")
    return {"unnamed columns (dbspec today)": Schema([ColSpec("double") for _ in names]),
            "named columns": Schema([ColSpec("double", n) for n in names]),
            "unnamed tensor (plain model)": Schema([TensorSpec(f64, (-1, len(names)))]),
            "named tensors, one per feature": Schema([TensorSpec(f64, (-1,), n) for n in names])}


def bodies(names: list[str], row: list[float]) -> dict[str, dict]:
    """One row in each form: positional, and named in training order or shuffled."""
    order = list(range(len(names)))
    random.Random(1).shuffle(order)
    shuffled, values = [names[i] for i in order], [row[i] for i in order]
    return {"inputs: rows": {"inputs": [row]},
            "inputs: columns, shuffled": {"inputs": {n: [v] for n, v in zip(shuffled, values)}},
            "inputs: records, shuffled": {"inputs": [dict(zip(shuffled, values))]},
            "instances: rows": {"instances": [row]},
            "instances: records, shuffled": {"instances": [dict(zip(shuffled, values))]},
            "dataframe_split: no columns": {"dataframe_split": {"data": [row]}},
            "dataframe_split: named": {"dataframe_split": {"columns": names, "data": [row]}},
            "dataframe_split: shuffled": {"dataframe_split": {"columns": shuffled,
                                                              "data": [values]}},
            "dataframe_records: shuffled": {"dataframe_records": [dict(zip(shuffled, values))]}}


def cell(model, schema: Schema, body: str, want: float, requests: int) -> tuple[str, float]:
    """What the handler does with ``body``: the cell's text and its median time (us), or
    :data:`REFUSED` / :data:`MISSCORED` (NaN: test with ``math.isnan``)."""
    def answer():
        return scoring_server.invocations(body, "application/json", model, schema)

    try:
        response = answer()
    except Exception:  # noqa: BLE001 - MLflow raises its parse errors; the app answers 400
        return "refused", REFUSED
    if response.status != 200:
        return "refused", REFUSED
    [got] = json.loads(response.response)["predictions"]
    if abs(got - want) > 1e-9 * max(1.0, abs(want)):
        return "MISSCORED", MISSCORED
    times = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(requests // 5):
            answer()
        times.append((time.perf_counter() - started) / (requests // 5) * 1e6)
    return f"ok {statistics.median(times):5.0f} us", statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="timed requests per cell")
    args = parser.parse_args()
    os.environ["_MLFLOW_IS_IN_SERVING_ENVIRONMENT"] = "true"  # as the scoring server sets it
    names, [row] = setup.diabetes_rows(1)
    want = float(np.dot(row, np.arange(1, len(names) + 1)))
    forms = {name: json.dumps(body) for name, body in bodies(names, row).items()}
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; mlflow "
          f"{mlflow.__version__}", flush=True)
    costs: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="dbspec-signatures-") as workdir:
        for label, schema in signatures(names).items():
            path = Path(workdir) / str(len(costs))
            mlflow.pyfunc.save_model(str(path), python_model=ProbeModel(names),
                                     signature=ModelSignature(inputs=schema))
            model = mlflow.pyfunc.load_model(str(path))
            print(f"\n{label}")
            costs[label] = {}
            for form, body in forms.items():
                text, costs[label][form] = cell(model, schema, body, want, args.requests)
                print(f"  {form:<30} {text}", flush=True)
    print("\nper signature: positional rows accepted, named columns (any order) accepted, "
          "silent misscoring, cheapest inputs form (us)")
    fit = {}
    for label, cost in costs.items():
        positional = cost["inputs: rows"] < REFUSED
        named = all(cost[f] != REFUSED for f in ("dataframe_split: shuffled",
                                                "dataframe_records: shuffled"))
        misscores = any(math.isnan(c) for c in cost.values())
        inputs = min((c for f, c in cost.items() if f.startswith("inputs") and not math.isnan(c)),
                     default=REFUSED)
        print(f"  {label:<32} positional {'yes' if positional else 'NO ':<3}  named "
              f"{'yes' if named else 'NO ':<3}  misscores {'YES' if misscores else 'no ':<3}  "
              f"inputs {inputs:>7,.0f}")
        if positional and named and not misscores:
            fit[label] = inputs
    plain = costs["unnamed tensor (plain model)"]["inputs: rows"]
    if not fit:
        print("no signature takes positional rows and named columns without misscoring")
        return
    label = min(fit, key=fit.__getitem__)
    print(f"cheapest signature taking positional and named input without misscoring, its inputs "
          f"cost over the tensor signature's: {fit[label] / plain:.2f}x ({label}); "
          f"<= 1.0 would let the row's goal be met by the signature alone")

if __name__ == "__main__":
    sys.exit(main())

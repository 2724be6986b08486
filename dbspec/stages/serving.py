"""The plan's last stage: ``batch_predict`` scores the spec's table with the served version;
``serve`` checks that the version an endpoint would serve loads and answers.

``batch_predict`` reads things that live outside the spec (the input table, where the alias
points now), so it runs on every ``dbspec run``. Smoke runs use the version they registered.
"""

from __future__ import annotations

from pathlib import Path

from dbspec.data.sources import DataError
from dbspec.errors import DbspecError
from dbspec.seams.targets import BatchRequest, find_target
from dbspec.stages.base import StageContext, registry_name
from dbspec.stages.outputs import BatchPredictOutput, PromoteOutput, RegisterOutput, ServeOutput


def _served_version(ctx: StageContext):
    """(client, target, version) of the model the spec serves now."""
    from dbspec.registry import RegistryError
    from dbspec.serving.source import resolve_version, spec_target

    target = spec_target(ctx.spec)._replace(name=registry_name(ctx.spec, ctx.options))
    if ctx.options.smoke:  # a smoke run checks the mechanics on its own model, gates or not
        target = target._replace(alias=None, version=ctx.output(RegisterOutput).version)
    client = ctx.tracker.client
    try:
        return client, target, resolve_version(client, target)
    except RegistryError as exc:
        decision = ctx.output(PromoteOutput).decision if ctx.has_output(PromoteOutput) else None
        hint = ""
        if decision == "rejected" and target.alias:
            hint = " (this run's model did not pass the gates, and no earlier version holds " \
                   "the alias)"
        elif decision == "deferred" and target.alias:
            hint = " (this run's model goes through its deployment job, which moves the alias)"
        elif decision == "awaiting_approval" and target.alias:
            promote = ctx.output(PromoteOutput)
            hint = f" (this run's model awaits approval for @{promote.alias}: dbspec approve " \
                   f"{promote.name} {promote.version} --alias {promote.alias})"
        raise DbspecError(f"nothing to serve: {exc}{hint}") from None


class BatchPredictStage:
    """Score ``serving.batch.input`` and write the predictions to ``serving.batch.output``."""

    name = "batch_predict"
    always_runs = True

    @staticmethod
    def check(spec) -> None:
        """The input must be there before the first stage runs, not after training and
        registering: a relative path is read from the current directory.

        Raises:
            DataError: a local input path that does not exist.
        """
        batch = spec.serving.batch
        if batch is None or "://" in batch.input:
            return
        path = Path(batch.input).expanduser()
        table_name = find_target("batch", batch.engine).reads_table_names and \
            "/" not in batch.input and \
            not batch.input.endswith((".parquet", ".csv", ".csv.gz"))  # main.ml.scoring
        if not table_name and not path.exists():
            where = "" if path.is_absolute() else f" (relative paths are read from {Path.cwd()})"
            raise DataError(f"serving.batch.input: {batch.input} does not exist{where}; "
                            "checked before any stage runs, so that nothing is trained for a "
                            "batch_predict that cannot read its input")

    def run(self, ctx: StageContext) -> BatchPredictOutput:
        from dbspec.serving.batch import out_of_range_line
        from dbspec.serving.source import load_version

        batch = ctx.spec.serving.batch
        target = find_target("batch", batch.engine)
        client, model, version = _served_version(ctx)
        loaded = load_version(client, model, version)
        output = str(ctx.directory / "predictions") if ctx.options.smoke else batch.output
        ctx.reporter.line(f"  scoring {batch.input} with {model.uri} (v{version}) "
                          f"{target.summary}" + (" (smoke: output kept in the run's state)"
                                                 if ctx.options.smoke else ""))
        setting = ctx.spec.serving.out_of_range
        result = target.run(BatchRequest(
            loaded, batch.input, output, fmt=batch.format, input_version=batch.input_version,
            out_of_range=(setting.action, setting.tolerance),
            progress=lambda rows, seconds: ctx.reporter.progress("rows", rows, rows,
                                                                 f"{rows / seconds:,.0f}/s"),
            spec=ctx.spec, session=ctx.spark))
        ctx.reporter.line(f"  wrote {result.rows:,} rows to {output}"
                          + (f" (Delta version {result.output_version})"
                             if result.output_version is not None else "")
                          + f" at {result.rows / max(result.seconds, 1e-9):,.0f} rows/s")
        if result.out_of_range_rows:
            ctx.reporter.line(f"  warning: {out_of_range_line(result)}")
        return BatchPredictOutput(
            rows=result.rows, output=output, format=result.format,
            out_of_range_rows=result.out_of_range_rows, output_version=result.output_version,
            input_version=result.input_version, model_uri=model.uri, model_version=version)


class ServeStage:
    """Load the version the endpoint would serve and send it real requests, in process."""

    name = "serve"

    def run(self, ctx: StageContext) -> ServeOutput:
        import asyncio

        import numpy as np

        from dbspec.serving.app import ScoringApp
        from dbspec.serving.asgi_client import post_json
        from dbspec.serving.source import load_version
        from dbspec.stages.data import load_data_access

        command = f"dbspec serve {ctx.loaded.file}" + (f" --target {ctx.loaded.target}"
                                                       if ctx.loaded.target else "")
        try:
            client, target, version = _served_version(ctx)
        except DbspecError as exc:  # a rejected first model: the run did its job all the same
            ctx.reporter.line(f"  {exc}")
            return ServeOutput(model_uri=None, model_version=None, command=command,
                               problem=str(exc))
        loaded = load_version(client, target, version)
        data = load_data_access(ctx)
        rows = data.head("test", 8)
        if list(loaded.feature_names) != list(data.feature_names):
            raise DbspecError(f"{target.uri} (v{version}) takes features "
                              f"{', '.join(loaded.feature_names)}, not this spec's")
        raw = data.raw_head("test", 8)  # a model with typed features takes raw columns
        body = {"inputs": rows.tolist()} if raw is None else {"dataframe_split": {
            "columns": list(raw.columns),
            "data": [[json_value(v) for v in row] for row in raw.itertuples(index=False)]}}
        status, answer = asyncio.run(post_json(ScoringApp(loaded), "/invocations", body))
        if status != 200:
            raise DbspecError(f"{target.uri} (v{version}) refused a request of test rows: "
                              f"{answer}")
        want = loaded.model.predict_frame(rows if raw is None else raw)["prediction"].tolist()
        got = [p["prediction"] for p in answer["predictions"]]
        same = np.allclose(np.asarray(got, dtype=float), np.asarray(want, dtype=float),
                           rtol=1e-5) if loaded.model.card.task == "regression" else got == want
        if not same:
            raise DbspecError(f"{target.uri} (v{version}) answered {got[:3]}... over the app but "
                              f"{want[:3]}... in process")
        ctx.reporter.line(f"  {target.uri} (v{version}) answers; start the endpoint with: "
                          f"{command}")
        return ServeOutput(model_uri=target.uri, model_version=version, command=command,
                           checked_rows=len(rows))


def json_value(value):
    """A raw cell as a JSON request carries it: image bytes as base64, arrays as lists,
    missing values as null."""
    import base64
    import math

    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        value = value.tolist()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value

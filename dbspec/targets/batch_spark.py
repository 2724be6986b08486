"""The ``batch_spark`` serving target: Spark scores the input, the model rebuilt once per
Python worker (``serving.batch.engine: spark``; :mod:`dbspec.serving.batch_spark`)."""

from __future__ import annotations

from typing import Any

from dbspec.seams.targets import BatchRequest
from dbspec.targets.common import BatchTarget


class SparkBatchTarget(BatchTarget):
    """Score a path or a catalog table on Spark: the request's session, else one started for
    the request (``local[*]`` unless a master URL or the spec says otherwise)."""

    name = "batch_spark"
    engine = "spark"
    reads_table_names = True
    summary = "on Spark"

    def run(self, request: BatchRequest) -> Any:
        """Score ``request.source`` into ``request.output``; returns the ``BatchResult``."""
        if request.session is not None:
            return _score(request.session, request)
        from dbspec.spark.session import spark_session

        with spark_session(request.spec, request.master, say=request.say) as spark:
            return _score(spark, request)


def _score(spark: Any, request: BatchRequest) -> Any:
    from dbspec.serving.batch_spark import predict_spark

    return predict_spark(spark, request.loaded, request.source, request.output,
                         fmt=request.fmt, input_version=request.input_version,
                         out_of_range=request.out_of_range)


TARGET = SparkBatchTarget()

"""The ``batch_spark`` serving target (``serving.batch.engine: spark``): see
:mod:`dbspec.serving.batch_spark`."""

from __future__ import annotations

import contextlib
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
        from dbspec.serving.batch_spark import predict_spark
        from dbspec.spark.session import spark_session

        with (contextlib.nullcontext(request.session) if request.session is not None
              else spark_session(request.spec, request.master, say=request.say)) as spark:
            return predict_spark(spark, request.loaded, request.source, request.output,
                                 fmt=request.fmt, input_version=request.input_version,
                                 out_of_range=request.out_of_range)


TARGET = SparkBatchTarget()

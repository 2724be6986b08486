"""The ``batch_local`` serving target (``serving.batch.engine: local``): see
:mod:`dbspec.serving.batch_local`."""

from __future__ import annotations

from typing import Any

from dbspec.seams.targets import BatchRequest
from dbspec.targets.common import BatchTarget


class LocalBatchTarget(BatchTarget):
    """Score a Parquet, CSV or Delta path in this process, larger than memory or not."""

    name = "batch_local"
    engine = "local"
    summary = "in this process"

    def run(self, request: BatchRequest) -> Any:
        from dbspec.serving.batch_local import predict_local

        progress = request.progress or (lambda rows, seconds: None)
        return predict_local(request.loaded, request.source, request.output, fmt=request.fmt,
                             input_version=request.input_version, progress=progress,
                             out_of_range=request.out_of_range)


TARGET = LocalBatchTarget()

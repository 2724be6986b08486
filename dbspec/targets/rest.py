"""The ``rest`` serving target: a REST server in this process speaking MLflow's scoring
protocol on uvicorn (``dbspec serve``; :mod:`dbspec.serving.server`)."""

from __future__ import annotations

from dbspec.seams.targets import ServeRequest


class RestTarget:
    """Serve a loaded version over HTTP on this machine until SIGINT or SIGTERM."""

    name = "rest"
    mode = "realtime"
    engine = "local"
    reads_table_names = False
    summary = "over HTTP in this process"

    def run(self, request: ServeRequest) -> None:
        """Serve ``request.loaded`` with ``request.options``; returns once stopped."""
        from dbspec.serving.server import serve

        serve(request.loaded, request.options, client=request.client, target=request.model,
              say=request.say)


TARGET = RestTarget()

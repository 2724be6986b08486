"""The ``rest`` serving target (``dbspec serve``): see :mod:`dbspec.serving.server`."""

from __future__ import annotations

from typing import Iterable

from dbspec.seams.targets import Finding, ServeRequest
from dbspec.targets.common import Target

#: Hosts a server may bind without a token: only this machine reaches them.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class RestTarget(Target):
    """Serve a loaded version over HTTP on this machine until SIGINT or SIGTERM."""

    name = "rest"
    mode = "realtime"
    engine = "local"
    summary = "over HTTP in this process"
    stage = "serve"

    def check(self, spec) -> Iterable[Finding]:
        """A server bound beyond this machine without a token."""
        realtime = spec.serving.realtime
        if realtime.host not in LOOPBACK_HOSTS and realtime.auth.token_env is None \
                and not realtime.auth.tokens:
            yield Finding(("serving", "realtime", "auth", "token_env"), f"binding "
                          f"{realtime.host} without a token would expose the model to the "
                          "network; name a token_env (or tokens per role)")

    def run(self, request: ServeRequest) -> None:
        from dbspec.serving.server import serve

        serve(request.loaded, request.options, client=request.client, target=request.model,
              say=request.say)


TARGET = RestTarget()

"""The serving-target seam: where a registered model version is put to use (a REST server,
batch scoring here or on Spark, a Databricks Model Serving endpoint).

A target carries out one ``serving.mode`` with one *engine* (``serving.batch.engine``,
``predict --engine``, where an endpoint runs). Callers find it with :func:`find_target` and hand
it one request, never switching on its name; a mode's plan stage (:func:`serving_stages`), job
task (:func:`job_tasks`), checks (:func:`serving_findings`) and job warnings
(:func:`job_warnings`) are asked of its targets too.

Adding a target: a module with a ``TARGET`` implementing :class:`ServingTarget`, then one line in
``TARGETS`` below, or an entry point in the ``dbspec.serving_targets`` group (a plugin).
"""

from __future__ import annotations

import difflib
from typing import (TYPE_CHECKING, Any, Callable, Iterable, NamedTuple, Optional, Protocol,
                    runtime_checkable)

from dbspec.errors import UsageError
from dbspec.plugins import KindRegistry
from dbspec.seams.compute import ComputeFinding as Finding

if TYPE_CHECKING:
    from dbspec.spec.sections import Spec


def _quiet(text: str) -> None:
    """Say nothing (the default of a request's ``say``)."""


class BatchRequest(NamedTuple):
    """Score one table with one model version: what a batch target's ``run`` takes.

    Attributes:
        loaded: The model version (:class:`dbspec.serving.app.LoadedModel`).
        source: The input: a Parquet, CSV or Delta path, or a table name where the target
            :attr:`~ServingTarget.reads_table_names`.
        output: Where the predictions go.
        fmt: ``delta`` or ``parquet``.
        input_version: The input's Delta version; None: the latest.
        out_of_range: ``serving.out_of_range``'s (action, tolerance).
        progress: Called with (rows, seconds) as batches are written, where the target can.
        spec: The spec whose settings a session the target starts follows (Spark's), or None.
        session: A session to score in (the Spark executor's); None: the target starts one.
        master: Where a session the target starts connects (a Spark master URL), or None.
        say: Where the target's own messages go (a session starting).

    Returns of ``run``: :class:`dbspec.serving.batch.BatchResult`.
    """

    loaded: Any
    source: str
    output: str
    fmt: str = "delta"
    input_version: Optional[int] = None
    out_of_range: tuple[str, float] = ("warn", 0.5)
    progress: Optional[Callable[[int, float], None]] = None
    spec: Any = None
    session: Any = None
    master: Optional[str] = None
    say: Callable[[str], None] = _quiet


class ServeRequest(NamedTuple):
    """Serve one model version until stopped: what a realtime target's ``run`` takes.

    Attributes:
        loaded: The model version.
        options: The server's settings (:class:`dbspec.serving.server.ServeOptions`).
        client: The registry client, for following the alias; None: no follow.
        model: Which registered model and alias (:class:`dbspec.serving.source.ModelTarget`).
        say: Where the server's messages go.

    Returns of ``run``: None, once the server has stopped.
    """

    loaded: Any
    options: Any
    client: Any = None
    model: Any = None
    say: Callable[[str], None] = print


class EndpointRequest(NamedTuple):
    """Point a remote endpoint at the version an alias holds: what a deploying realtime
    target's ``run`` takes.

    Attributes:
        client: The registry client that reads the alias.
        model: Which registered model and alias (:class:`dbspec.serving.source.ModelTarget`).
        endpoint: The endpoint's name.
        config: Version -> the endpoint's (served entities, settings) for a new endpoint.
        permissions: The access levels to set on the endpoint; None: leave them.
        dry_run: Report what would change; change nothing.
        wait: How long to wait for the new version to serve (a ``timedelta``); None: no wait.

    Returns of ``run``: :class:`dbspec.serving.databricks_endpoint.EndpointUpdate`.
    """

    client: Any
    model: Any
    endpoint: str
    config: Callable[[str], Any]
    permissions: Optional[list] = None
    dry_run: bool = False
    wait: Any = None


@runtime_checkable
class ServingTarget(Protocol):
    """What dbspec asks of a serving target.

    Attributes:
        name: The target's name in :data:`TARGETS`.
        mode: The ``serving.mode`` it carries out: ``realtime`` or ``batch``.
        engine: What picks it within its mode: the batch engine (``serving.batch.engine``,
            ``predict --engine``) or where a realtime endpoint runs (``local``,
            ``databricks``).
        reads_table_names: Whether its input may name a catalog table rather than a path.
        summary: Where it runs, in a few words, for progress lines (``on Spark``).
        stage: The plan stage that carries out its mode in ``dbspec run`` (``serve``,
            ``batch_predict``); None: no stage, it runs from a command or a job task only.
        job_task: The task a generated Databricks job adds for it beyond the stages' tasks
            (``update_endpoint``); None: none.
    """

    @property
    def name(self) -> str: ...

    @property
    def mode(self) -> str: ...

    @property
    def engine(self) -> str: ...

    @property
    def reads_table_names(self) -> bool: ...

    @property
    def summary(self) -> str: ...

    @property
    def stage(self) -> Optional[str]: ...

    @property
    def job_task(self) -> Optional[str]: ...

    def check(self, spec: Spec) -> Iterable[Finding]:
        """Problems of ``spec.serving`` that types alone cannot express, found at validate
        (asked of every target of the spec's ``serving.mode``)."""

    def job_warnings(self, spec: Spec) -> Iterable[str]:
        """What would break in a Databricks job although the spec is valid."""

    def run(self, request: Any) -> Any:
        """Carry out one request of the kind its mode takes (:class:`BatchRequest`,
        :class:`ServeRequest` or :class:`EndpointRequest`; see each for what comes back)."""


#: The serving targets: dbspec's own, plus those of installed plugins.
TARGETS: KindRegistry[ServingTarget] = KindRegistry(
    "dbspec.serving_targets", "serving target", {
        "rest": "dbspec.targets.rest:TARGET",
        "batch_local": "dbspec.targets.batch_local:TARGET",
        "batch_spark": "dbspec.targets.batch_spark:TARGET",
        "databricks_endpoint": "dbspec.targets.databricks_endpoint:TARGET",
    })


def engines(mode: str) -> dict[str, ServingTarget]:
    """Engine -> target, for every target of ``mode`` that loads (built-ins first)."""
    found: dict[str, ServingTarget] = {}
    for target in TARGETS.load_all().values():
        if target.mode == mode:
            found.setdefault(target.engine, target)
    return found


def find_target(mode: str, engine: str) -> ServingTarget:
    """The target that carries out ``mode`` on ``engine``.

    Raises:
        UsageError: no target does (with the closest engine, the known ones, and plugins
            that failed to load).
    """
    found = engines(mode)
    if engine in found:
        return found[engine]
    close = difflib.get_close_matches(engine, list(found), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    failed = TARGETS.failures()
    broken = ("; serving targets that failed to load: "
              + "; ".join(f"{name}: {why}" for name, why in sorted(failed.items()))
              if failed else "")
    raise UsageError(f"no {mode} serving target runs on {engine!r}{hint}; known engines: "
                     f"{', '.join(found) or 'none'} (more come from packages registering "
                     f"entry points in {TARGETS.group!r}){broken}")


def serving_stages(mode: str) -> tuple[str, ...]:
    """The plan stages that carry out ``serving.mode``: its targets' stages, each once (none
    for a mode no target carries out, such as ``none``)."""
    return tuple(dict.fromkeys(t.stage for t in engines(mode).values() if t.stage))


def job_tasks(mode: str) -> tuple[str, ...]:
    """The tasks a generated job adds for ``serving.mode`` beyond the stages' tasks."""
    return tuple(dict.fromkeys(t.job_task for t in engines(mode).values() if t.job_task))


def serving_findings(spec: Spec) -> list[Finding]:
    """Problems of ``spec.serving`` at validate: a mode some target carries out loads a
    registered model, then each of the mode's targets checks the spec (each problem once)."""
    mode = spec.serving.mode
    targets = list(engines(mode).values())
    found = [Finding(("serving", "mode"), f"{mode} serving loads a registered model; add a "
                     "registry section with a name")] if targets and spec.registry is None \
        else []
    found += [finding for target in targets for finding in target.check(spec)]
    return list(dict.fromkeys(found))


def job_warnings(spec: Spec) -> list[str]:
    """What the targets of ``spec.serving.mode`` say would break in a Databricks job."""
    return list(dict.fromkeys(warning for target in engines(spec.serving.mode).values()
                              for warning in target.job_warnings(spec)))

"""What ``dbspec serve``, ``predict`` and ``endpoint`` do, one function each: read the model the
command names, merge its flags (typed records; a flag left out is None) with the spec's
``serving`` section, else dbspec's defaults, and hand one request to the serving target.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

from dbspec.errors import UsageError
from dbspec.seams.targets import BatchRequest, EndpointRequest, ServeRequest, find_target
from dbspec.serving.server import ConnectionLimits, ServeOptions


class ModelChoice(NamedTuple):
    """Which registered model a command serves.

    Attributes:
        model: A spec file (its registered model and alias) or a ``models:/`` URI.
        target: The spec's target to apply.
        assignments: ``PATH=VALUE`` overrides of the spec.
        alias: Serve this alias of the model instead.
        tracking_uri: The MLflow tracking/registry URI; None: the environment's or the spec's.
        state_dir: The state directory of local runs (its local store).
    """

    model: str
    target: Optional[str] = None
    assignments: tuple[str, ...] = ()
    alias: Optional[str] = None
    tracking_uri: Optional[str] = None
    state_dir: str = ".dbspec"


class OpenedModel(NamedTuple):
    """The model a :class:`ModelChoice` names, resolved in the registry."""

    spec: Any  #: the spec, or None for a ``models:/`` URI
    client: Any  #: the registry client
    model: Any  #: :class:`~dbspec.serving.source.ModelTarget`
    version: str


class ServeFlags(NamedTuple):
    """``dbspec serve``'s settings; None: ``serving.realtime``'s value, else the default."""

    host: Optional[str] = None
    port: Optional[int] = None
    token_env: Optional[str] = None
    no_auth: bool = False
    max_batch_size: Optional[int] = None
    max_wait_ms: Optional[float] = None
    max_body_bytes: Optional[int] = None
    max_header_bytes: Optional[int] = None
    header_timeout: Optional[float] = None
    keep_alive_timeout: Optional[float] = None
    max_connections: Optional[int] = None
    inference_table: Optional[str] = None
    watch_alias: bool = False
    watch_interval: float = 10.0
    out_of_range: Optional[str] = None


class PredictFlags(NamedTuple):
    """``dbspec predict``'s settings; None: ``serving.batch``'s value, else the default."""

    input: Optional[str] = None
    input_version: Optional[int] = None
    output: Optional[str] = None
    format: Optional[str] = None
    engine: Optional[str] = None
    master: Optional[str] = None
    out_of_range: Optional[str] = None


class Prediction(NamedTuple):
    """What :func:`predict_table` did: the engine's result and what it scored with."""

    result: Any  #: :class:`~dbspec.serving.batch.BatchResult`
    output: str
    format: str
    model_name: str
    model_version: str


class EndpointFlags(NamedTuple):
    """``dbspec endpoint``'s settings."""

    file: str
    target: Optional[str] = None
    assignments: tuple[str, ...] = ()
    endpoint: Optional[str] = None
    alias: Optional[str] = None
    wait: bool = False
    dry_run: bool = False
    tracking_uri: Optional[str] = None
    state_dir: str = ".dbspec"


def open_model(choice: ModelChoice) -> OpenedModel:
    """The spec (or None), registry client, model and version a command's model names.

    Raises:
        UsageError: ``--target`` or ``--set`` with a ``models:/`` URI.
        RegistryError: the registry does not answer, or holds no such version.
    """
    from dbspec.serving.source import (open_client, parse_model_uri, resolve_version,
                                       spec_target, tracking_uri_for)

    _fail_fast_registry()
    spec = None
    if choice.model.startswith("models:/"):
        if choice.target or choice.assignments:
            raise UsageError("--target and --set apply to a spec, not to a models:/ URI")
        model = parse_model_uri(choice.model)
        if choice.alias:
            model = model._replace(alias=choice.alias, version=None)
    else:
        from dbspec.spec.loader import load_spec

        spec = load_spec(choice.model, target=choice.target,
                         assignments=list(choice.assignments)).spec
        model = spec_target(spec, alias=choice.alias)
    client = open_client(tracking_uri_for(spec, choice.tracking_uri), Path(choice.state_dir))
    return OpenedModel(spec, client, model, resolve_version(client, model))


def _fail_fast_registry() -> None:
    """A registry that does not answer should fail in seconds, not after MLflow's 7 retries."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


def out_of_range(given: Optional[str], spec: Any) -> tuple[str, float]:
    """(action, tolerance) for rows outside the training range: the flag, else the spec's."""
    setting = spec.serving.out_of_range if spec is not None else None
    action = given or (setting.action if setting is not None else "warn")
    return action, (setting.tolerance if setting is not None else 0.5)


def serve_options(flags: ServeFlags, spec: Any) -> ServeOptions:
    """The server's settings: each flag, else the spec's ``serving.realtime``, else the
    default."""
    realtime = spec.serving.realtime if spec is not None else None

    def pick(given: Any, field: str, default: Any) -> Any:
        if given is not None:
            return given
        return getattr(realtime, field) if realtime is not None else default

    table, queue_size = flags.inference_table, 10_000
    if table is None and realtime is not None and realtime.inference_table is not None \
            and realtime.inference_table.enabled:
        table, queue_size = realtime.inference_table.path, realtime.inference_table.queue_size
    limits = ConnectionLimits(
        max_header_bytes=pick(flags.max_header_bytes, "max_header_bytes", 65_536),
        header_timeout_s=pick(flags.header_timeout, "header_timeout_seconds", 10.0),
        keep_alive_timeout_s=pick(flags.keep_alive_timeout, "keep_alive_timeout_seconds", 5.0),
        max_connections=pick(flags.max_connections, "max_connections", 1000))
    action, tolerance = out_of_range(flags.out_of_range, spec)
    return ServeOptions(
        host=pick(flags.host, "host", "127.0.0.1"), port=pick(flags.port, "port", 8080),
        token_env=flags.token_env or (realtime.auth.token_env if realtime is not None
                                      else "DBSPEC_TOKEN"),
        no_auth=flags.no_auth,
        tokens=tuple(sorted(realtime.auth.tokens.items())) if realtime is not None else (),
        max_batch_size=pick(flags.max_batch_size, "max_batch_size", 64),
        max_wait_ms=pick(flags.max_wait_ms, "max_wait_ms", 2.0),
        max_body_bytes=pick(flags.max_body_bytes, "max_body_bytes", 5_000_000),
        inference_table=Path(table) if table else None, queue_size=queue_size,
        watch_alias=flags.watch_alias or bool(realtime is not None and realtime.watch_alias),
        watch_interval_s=flags.watch_interval, limits=limits, out_of_range=action,
        out_of_range_tolerance=tolerance)


def serve_model(choice: ModelChoice, flags: ServeFlags, *,
                say: Callable[[str], None] = print) -> None:
    """Serve the chosen version on the ``local`` realtime target until SIGINT or SIGTERM.

    Raises:
        DbspecError: no token where one is needed (before the slow model load), no such
            version, or a server that does not start.
    """
    from dbspec.serving.server import resolve_tokens
    from dbspec.serving.source import load_version

    target = find_target("realtime", "local")
    opened = open_model(choice)
    options = serve_options(flags, opened.spec)
    resolve_tokens(options)  # refuse before the slow model load
    loaded = load_version(opened.client, opened.model, opened.version, without_torch=True)
    target.run(ServeRequest(loaded, options, client=opened.client, model=opened.model,
                            say=say))


def predict_table(choice: ModelChoice, flags: PredictFlags, *,
                  progress: Optional[Callable[[int, float], None]] = None,
                  say: Callable[[str], None] = print) -> Prediction:
    """Score the input with the chosen version on the batch target of the engine asked for.

    Raises:
        UsageError: no input or output (nor a spec with ``serving.batch``), or no batch
            target runs on the engine.
        DataError: the engine's refusals (bad input, rows it cannot score...).
    """
    from dbspec.models.card import probability_meaning
    from dbspec.serving.source import load_version

    opened = open_model(choice)
    batch = opened.spec.serving.batch if opened.spec is not None else None
    source = flags.input or (batch.input if batch else None)
    output = flags.output or (batch.output if batch else None)
    if not source or not output:
        raise UsageError("predict needs --input and --output (or a spec with serving.batch)")
    input_version = flags.input_version if flags.input_version is not None else (
        batch.input_version if batch and not flags.input else None)
    fmt = flags.format or (batch.format if batch else "delta")
    target = find_target("batch", flags.engine or (batch.engine if batch else "local"))
    loaded = load_version(opened.client, opened.model, opened.version)
    meaning = probability_meaning(loaded.model.card)
    say(f"scoring {source} with {opened.model.uri} (v{opened.version}) {target.summary}"
        + (f"; {meaning}" if meaning else ""))
    result = target.run(BatchRequest(
        loaded, source, output, fmt=fmt, input_version=input_version,
        out_of_range=out_of_range(flags.out_of_range, opened.spec), progress=progress,
        spec=opened.spec, master=flags.master, say=say))
    return Prediction(result, output, fmt, loaded.name, loaded.version)


def update_endpoint(flags: EndpointFlags) -> Any:
    """Put the spec's alias holder on its Databricks serving endpoint (default name: the
    spec's name and target), created with the spec's settings when it does not exist.

    Returns:
        The :class:`~dbspec.serving.databricks_endpoint.EndpointUpdate` (``describe()`` it).
    """
    import mlflow

    from dbspec.jobs.resources import endpoint_config, endpoint_name, endpoint_permissions
    from dbspec.registry.commands import open_registry
    from dbspec.serving.databricks_endpoint import WAIT, checked_name
    from dbspec.serving.source import spec_target, tracking_uri_for
    from dbspec.spec.loader import load_spec

    target = find_target("realtime", "databricks")
    _fail_fast_registry()
    spec = load_spec(flags.file, target=flags.target, assignments=list(flags.assignments)).spec
    name = checked_name(flags.endpoint or endpoint_name(spec, flags.target or "default"))
    client = open_registry(tracking_uri_for(spec, flags.tracking_uri),
                           Path(flags.state_dir)).client
    if spec.tracking.registry_uri and not os.environ.get("MLFLOW_REGISTRY_URI"):
        client = mlflow.MlflowClient(registry_uri=spec.tracking.registry_uri)
    return target.run(EndpointRequest(
        client, spec_target(spec, alias=flags.alias), name,
        config=lambda version: endpoint_config(spec, name, version),
        permissions=endpoint_permissions(spec), dry_run=flags.dry_run,
        wait=WAIT if flags.wait else None))

"""Compile a validated spec into a DAG of stages with fingerprints.

A stage's fingerprint hashes the spec values it reads and its upstream fingerprints (plus the
data version for the data stages), so a change reruns exactly the stages that depend on it.
Only the data stages' own fingerprints include the executor: what later stages hash is their
``chain``, without it, so the same data from either executor does not retrain the model.
"""

from __future__ import annotations

import graphlib
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from dbspec.seams.targets import serving_stages
from dbspec.spec.sections import Spec

#: The stages whose work the executor does (through Spark with ``--executor spark``).
DATA_STAGES = ("load_data", "split", "preprocess")

#: What each stage kind reads from the spec, as dotted paths.
STAGE_READS: dict[str, tuple[str, ...]] = {
    "load_data": ("data.source", "data.target", "data.features", "data.task"),
    "split": ("data.split", "data.task"),
    "preprocess": ("data.preprocessing",),
    "tune": ("vars", "model", "training", "compute", "search"),
    "train": ("model", "training", "compute", "tracking", "evaluation.threshold",
              "serving.out_of_range"),  # the logged model applies it
    "evaluate": ("evaluation",),
    "register": ("registry.name", "registry.tags", "tracking"),
    "promote": ("registry.promotion",),
    "serve": ("serving",),
    "batch_predict": ("serving",),
}

#: What ``load_data`` reads besides, when the data streams: shards are split as they are
#: written, and the streaming settings that change what is trained on or in what order.
#: ``prefetch``, ``cache_dir`` and ``location`` change where and when shards are read, not the
#: result: moving the shards or reading further ahead does not retrain.
STREAMED_LOAD_READS = ("data.split",) + tuple(
    f"data.streaming.{name}" for name in ("enabled", "in_memory_limit_mb", "format",
                                          "shard_size_mb", "shuffle", "shuffle_window", "key",
                                          "sample_rows"))
#: What ``preprocess`` reads besides with ``model.pretrained``: the checkpoint's tokenizer.
PRETRAINED_PREPROCESS_READS = ("model.pretrained.checkpoint", "model.pretrained.revision")


@dataclass(frozen=True)
class PlannedStage:
    """One node of the plan: a stage kind (also its name), its inputs and what it reads.

    Attributes:
        fingerprint: Hex digest of what it reads and its upstream fingerprints.
        config: The values at ``reads`` (JSON-ready), the stage's own slice of the spec.
        chain: What its dependents hash for it: the fingerprint without the executor. A rerun
            whose chain is unchanged leaves its dependents' outputs valid.
    """

    name: str
    depends_on: tuple[str, ...]
    reads: tuple[str, ...]
    fingerprint: str
    config: dict[str, Any]
    chain: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The plan's JSON form of this stage."""
        return {"name": self.name, "depends_on": list(self.depends_on), "reads": list(self.reads),
                "fingerprint": self.fingerprint}


@dataclass(frozen=True)
class Plan:
    """Stages in a valid execution order."""

    spec_name: str
    stages: tuple[PlannedStage, ...]

    def __iter__(self) -> Iterator[PlannedStage]:
        return iter(self.stages)

    def __getitem__(self, name: str) -> PlannedStage:
        return {stage.name: stage for stage in self.stages}[name]

    @property
    def names(self) -> tuple[str, ...]:
        """Stage names in execution order."""
        return tuple(s.name for s in self.stages)

    def downstream(self, name: str) -> tuple[str, ...]:
        """``name`` and every stage that depends on it, directly or not, in order."""
        affected = {name}
        for stage in self.stages:
            if affected.intersection(stage.depends_on):
                affected.add(stage.name)
        return tuple(s.name for s in self.stages if s.name in affected)

    def ancestors(self, name: str) -> tuple[str, ...]:
        """Every stage ``name`` depends on, directly or not, in order."""
        needed = set(self[name].depends_on)
        for stage in reversed(self.stages):
            if stage.name in needed:
                needed.update(stage.depends_on)
        return tuple(s.name for s in self.stages if s.name in needed)

    def to_dict(self) -> dict[str, Any]:
        """``{"stages": [{"name", "depends_on", "reads", "fingerprint"}]}``."""
        return {"stages": [s.to_dict() for s in self.stages]}


def _edges(spec: Spec) -> dict[str, tuple[str, ...]]:
    """Stage -> the stages it depends on, for this spec's sections."""
    edges: dict[str, tuple[str, ...]] = {"load_data": (), "split": ("load_data",),
                                         "preprocess": ("split",)}
    if spec.search is not None:
        edges["tune"] = ("preprocess",)
    edges["train"] = ("preprocess", "tune") if spec.search is not None else ("preprocess",)
    edges["evaluate"] = ("train", "preprocess")
    last = "evaluate"
    if spec.registry is not None:
        edges["register"] = ("train", "evaluate")
        last = "register"
        if spec.registry.promotion is not None:
            edges["promote"] = ("register", "evaluate")
            last = "promote"
    for stage in serving_stages(spec.serving.mode):  # what the mode's targets run as
        edges[stage] = (last,)
    return edges


def compile_plan(spec: Spec, *, data_version: Optional[str] = None,
                 executor: str = "local", checkpoint_version: Optional[str] = None) -> Plan:
    """Compile ``spec`` into a :class:`Plan`.

    Args:
        spec: A validated spec.
        data_version: The resolved version of the source data (a Delta version, a file hash),
            when the executor knows it; it enters the data stages' fingerprints.
        executor: ``local`` or ``spark``; it enters the :data:`DATA_STAGES`' own fingerprints.
            ``local`` adds nothing, so local fingerprints are those of earlier dbspec versions.
        checkpoint_version: What ``model.pretrained``'s local checkpoint holds
            (:func:`dbspec.spec.checkpoints.checkpoint_version`); it enters ``preprocess``
            (its tokenizer) and through it every later stage.
    """
    edges = _edges(spec)
    dumped = spec.model_dump(mode="json", by_alias=True)
    order = list(graphlib.TopologicalSorter(edges).static_order())
    chained: dict[str, str] = {}  # what a stage's dependents hash for it
    stages = []
    for name in order:
        reads = STAGE_READS[name]
        if name == "load_data" and spec.data.streaming is not None:
            reads = reads + STREAMED_LOAD_READS  # the split is decided while converting
        if name == "preprocess" and spec.model.pretrained is not None:
            reads = reads + PRETRAINED_PREPROCESS_READS
        config = {path: _lookup(dumped, path) for path in reads}
        payload = {
            "stage": name,
            "reads": config,
            "upstream": [chained[d] for d in edges[name]],
            "data_version": data_version if name == "load_data" else None,
        }
        if name == "preprocess" and checkpoint_version is not None:
            payload["checkpoint_version"] = checkpoint_version
        chained[name] = fingerprint = _digest(payload)
        if name in DATA_STAGES and executor != "local":
            fingerprint = _digest({**payload, "executor": executor})
        stages.append(PlannedStage(name, edges[name], reads, fingerprint, config,
                                   chained[name]))
    return Plan(spec.name, tuple(stages))


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()
                          ).hexdigest()[:16]


def _lookup(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node

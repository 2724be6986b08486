"""How the Ray cluster on Spark is sized for the spec's training workers.

Sizing, from ``ray.util.spark.cluster_init`` (Ray 2.60): on a cluster master (``spark://``,
``local-cluster[...]``, ``yarn``) Spark stage scheduling gives each Ray worker node exactly
``cpus_per_worker`` CPUs (and one GPU with ``use_gpu``), one node per training worker. A local
master (``local[N]``) is supported but has no stage scheduling: every worker node gets
``spark.task.cpus`` CPUs and no GPU, so when the workers do not fit such nodes (GPUs, more CPUs
per worker than ``spark.task.cpus``, or more nodes than ``local[N]`` runs at once) they run on
the head node, which is the same machine there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

#: The object store per Ray node: the ranks read their shards from files, so Ray only carries
#: the train function and small records (Ray's default is 30% of the node's memory).
OBJECT_STORE_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class RayLayout:
    """How the Ray cluster is sized for the spec's workers, as ``setup_ray_cluster`` arguments."""

    worker_nodes: int
    min_worker_nodes: int
    cpus_per_node: Optional[int]  # None: Spark's task size decides (a local master)
    gpus_per_node: Optional[int]
    head_cpus: int
    head_gpus: int
    where: str  # in words, for the progress line and the summary

    def setup_arguments(self) -> dict[str, Any]:
        arguments: dict[str, Any] = {
            "max_worker_nodes": self.worker_nodes, "min_worker_nodes": self.min_worker_nodes,
            "num_cpus_head_node": self.head_cpus, "num_gpus_head_node": self.head_gpus,
            "object_store_memory_worker_node": OBJECT_STORE_BYTES,
            "head_node_options": {"include_dashboard": False}}
        if self.cpus_per_node is not None:
            arguments.update(num_cpus_worker_node=self.cpus_per_node,
                             num_gpus_worker_node=self.gpus_per_node or 0)
        if self.head_cpus or self.head_gpus:
            arguments["object_store_memory_head_node"] = OBJECT_STORE_BYTES
        return arguments


def ray_layout(compute, *, use_gpu: bool, master: str, task_cpus: int = 1,
               parallelism: int = 1) -> RayLayout:
    """The Ray cluster for ``compute`` (kind ray, ``use_gpu`` resolved) on ``master``, whose
    tasks have ``task_cpus`` (``spark.task.cpus``) and run ``parallelism`` at once."""
    from dbspec.spark.placement import is_local_master

    workers, cpus = compute.num_workers, compute.cpus_per_worker
    plural = "s" if workers > 1 else ""
    if not is_local_master(master):
        gpu = ", 1 GPU" if use_gpu else ""
        return RayLayout(workers, workers, cpus, 1 if use_gpu else 0, 0, 0,
                         f"{workers} Ray worker node{plural} on the executors of {master} "
                         f"({cpus} CPU{'s' if cpus > 1 else ''}{gpu} each)")
    per_node = task_cpus // cpus
    nodes = math.ceil(workers / per_node) if per_node else 0
    slots = max(1, parallelism // max(1, task_cpus))
    if not use_gpu and per_node and nodes <= slots:
        return RayLayout(nodes, nodes, None, None, 0, 0,
                         f"{nodes} Ray worker node{'s' if nodes > 1 else ''} in Spark tasks of "
                         f"{master} ({task_cpus} CPU{'s' if task_cpus > 1 else ''} each)")
    why = ("GPUs" if use_gpu else f"{cpus} CPUs per worker > spark.task.cpus {task_cpus}"
           if not per_node else f"{nodes} worker nodes > {slots} task slots")
    # at least one worker node is required; with min 0 it is started only on unmet demand
    return RayLayout(1, 0, None, None, workers * cpus, workers if use_gpu else 0,
                     f"the Ray head node on this machine ({master}; {why})")

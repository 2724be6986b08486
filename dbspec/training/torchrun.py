"""Ranks started by PyTorch's own launcher, ``torchrun`` (``python -m torch.distributed.run``):
how AI Runtime trains on several GPUs and nodes, and on a laptop the same spec's ranks.

AI Runtime runs the job's command on every node and sets ``NUM_NODES``, ``NODE_RANK``,
``MASTER_ADDR``, ``MASTER_PORT`` and ``LOCAL_WORLD_SIZE`` there, but no ``RANK``: torchrun
starts one :func:`~dbspec.training.rank.rank_main` per GPU. Node 0 runs the stages; when it
reaches training it writes the torchrun command to ``$DBSPEC_RENDEZVOUS/launch.sh``, which the
other nodes wait for (the command script) and run with their own ``NODE_RANK``. Without those
variables (a laptop, a test) the ranks start here, ``--standalone``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Callable

from dbspec.atomic import write_atomic
from dbspec.spec.databricks import RENDEZVOUS
from dbspec.training.job import DistributedError, rank_errors



def torchrun_command(work_dir: Path, ranks_here: int) -> list[str]:
    """The launcher's command line on this node: ``ranks_here`` processes, joined to the other
    nodes when AI Runtime says there are some (``NODE_RANK`` is left to each node's shell)."""
    nodes = int(os.environ.get("NUM_NODES", "1") or 1)
    where = ["--standalone"] if nodes == 1 else [
        f"--nnodes={nodes}", "--node_rank=${NODE_RANK}", "--master_addr=${MASTER_ADDR}",
        "--master_port=${MASTER_PORT}"]
    return [sys.executable, "-m", "torch.distributed.run", *where,
            f"--nproc_per_node={ranks_here}", "-m", "dbspec.training.rank", str(work_dir)]


def run_torchrun(work_dir: Path, ranks_here: int, say: Callable[[str], None]) -> str:
    """Start the ranks with torchrun and wait for them; returns where they ran, in words.

    Raises:
        DistributedError: a rank failed (its error is in the message), or torchrun did.
    """
    command = torchrun_command(work_dir, ranks_here)
    nodes = int(os.environ.get("NUM_NODES", "1") or 1)
    if nodes > 1:
        meeting = os.environ.get(RENDEZVOUS)
        if not meeting:
            raise DistributedError(f"{nodes} nodes but no {RENDEZVOUS}: the other nodes cannot "
                                   "find the training (run the generated command script)")
        Path(meeting).mkdir(parents=True, exist_ok=True)
        write_atomic(Path(meeting) / "launch.sh", f"exec {_shell(command)}\n")
        say(f"  torchrun: {nodes} nodes x {ranks_here} ranks; the other nodes join from "
            f"{meeting}/launch.sh")
    # the ranks' output goes where this process's goes, as it comes (the node's log)
    done = subprocess.run(["bash", "-c", _shell(command)], stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        why = rank_errors(work_dir) or "no rank recorded an error; see torchrun's output above"
        raise DistributedError(f"torchrun failed (exit {done.returncode}): {why}")
    return f"{nodes} node(s) x {ranks_here} rank(s) by torchrun, files in {work_dir}"


def _shell(command: list[str]) -> str:
    """``command`` for bash, the ``${NODE_RANK}``-style parts expanded by the node's shell."""
    return " ".join(f'"{p}"' if "${" in p else shlex.quote(p) for p in command)

"""The built-in compute kinds: each satisfies the seam's Protocol, and answers what validate,
plan, run and jobs ask of it as the switches it replaced did."""

from __future__ import annotations

import contextlib
import io
import typing

import pytest

from dbspec.cli import main
from dbspec.seams.compute import COMPUTE, ComputeKind, RankSettings
from dbspec.spec.databricks import Resources
from dbspec.spec.sections import Spec
from tests.conftest import MINIMAL

BUILTINS = tuple(COMPUTE.builtins)


def _compute(kind: str, **settings):
    """A validated ``compute`` section of ``kind``."""
    return Spec.model_validate({"name": "x", "data": {"source": {"kind": "sklearn",
                                                                 "name": "diabetes"},
                                                      "task": "regression"},
                                "model": {"layers": [{"linear": {"out": 1}}]},
                                "compute": {"kind": kind, **settings}}).compute


def test_the_six_builtins_load():
    assert BUILTINS == ("local", "single_gpu", "torch_distributor", "deepspeed", "ray",
                        "serverless_gpu")
    assert set(COMPUTE.load_all()) >= set(BUILTINS)
    assert not {name: why for name, why in COMPUTE.failures().items() if name in BUILTINS}
    assert all(COMPUTE.origin(name) == "built-in" for name in BUILTINS)


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_satisfies_the_protocol(name):
    kind = COMPUTE.get(name)
    assert isinstance(kind, ComputeKind)
    assert kind.name == name
    assert typing.get_args(kind.model.model_fields["kind"].annotation) == (name,)
    members = [m for m in dir(ComputeKind) if not m.startswith("_")]
    for member in members:
        assert hasattr(kind, member), f"{name} lacks {member}"
    assert isinstance(kind.distributed, bool) and isinstance(kind.serverless, bool)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in kind.extras.items())


@pytest.mark.parametrize("name, world, remote, resources, gpu, job_gpu", [
    ("local", 1, None, Resources(0, 0, False), False, False),
    ("single_gpu", 1, None, Resources(1, 0, False), True, True),
    ("torch_distributor", 2, None, Resources(2, 0, False), False, True),
    ("deepspeed", 1, None, Resources(1, 0, False), True, True),
    ("ray", 2, "training ranks (Ray Train workers on Ray-on-Spark worker nodes)",
     Resources(1, 2, True), False, True),
    ("serverless_gpu", 1, None, Resources(0, 0, False), True, True),
])
def test_what_each_kind_answers_by_default(name, world, remote, resources, gpu, job_gpu):
    kind, compute = COMPUTE.get(name), _compute(name)
    assert kind.world_size(compute) == world
    assert kind.remote_ranks(compute) == remote
    assert kind.resources(compute) == resources
    assert kind.gpu_expected(compute) is gpu
    assert kind.trains_on_gpu(compute) is job_gpu


@pytest.mark.parametrize("name, settings, world, resources", [
    ("torch_distributor", {"num_processes": 4, "local_mode": False}, 4, Resources(1, 4, True)),
    ("torch_distributor", {"use_gpu": False}, 2, Resources(0, 0, False)),
    ("deepspeed", {"num_gpus": 4, "num_nodes": 2}, 8, Resources(4, 2, True)),
    ("deepspeed", {"use_gpu": False, "num_gpus": 2}, 2, Resources(0, 0, False)),
    ("ray", {"num_workers": 3, "use_gpu": False}, 3, Resources(0, 3, True)),
    ("local", {"device": "cuda"}, 1, Resources(1, 0, False)),
])
def test_sizes_follow_the_settings(name, settings, world, resources):
    kind, compute = COMPUTE.get(name), _compute(name, **settings)
    assert kind.world_size(compute) == world
    assert kind.resources(compute) == resources


def test_ranks_on_executors_without_local_mode():
    kind = COMPUTE.get("torch_distributor")
    assert kind.remote_ranks(_compute("torch_distributor", local_mode=False)) == \
        "training ranks (compute.local_mode: false)"


@pytest.mark.parametrize("name, distributed", [("local", False), ("single_gpu", False),
                                               ("serverless_gpu", False),
                                               ("torch_distributor", True), ("deepspeed", True),
                                               ("ray", True)])
def test_which_kinds_train_on_ranks(name, distributed):
    assert COMPUTE.get(name).distributed is distributed


def test_only_serverless_gpu_runs_on_ai_runtime():
    assert [n for n in BUILTINS if COMPUTE.get(n).serverless] == ["serverless_gpu"]


def test_what_kinds_need_installed():
    assert {n: dict(COMPUTE.get(n).extras) for n in BUILTINS if COMPUTE.get(n).extras} == \
        {"deepspeed": {"deepspeed": "deepspeed"}, "ray": {"ray": "ray"}}


def test_an_in_process_kind_has_no_ranks():
    from dbspec.errors import DbspecError

    spec = Spec.model_validate({"name": "x", "data": {"source": {"kind": "sklearn",
                                                                 "name": "diabetes"},
                                                      "task": "regression"},
                                "model": {"layers": [{"linear": {"out": 1}}]}})
    with pytest.raises(DbspecError, match="trains in this process, not on ranks"):
        COMPUTE.get("local").rank_settings(spec)


def test_ddp_rank_settings_resolve_the_backend():
    spec = Spec.model_validate({"name": "x", "data": {"source": {"kind": "sklearn",
                                                                 "name": "diabetes"},
                                                      "task": "regression"},
                                "model": {"layers": [{"linear": {"out": 1}}]},
                                "compute": {"kind": "torch_distributor", "use_gpu": False}})
    assert COMPUTE.get("torch_distributor").rank_settings(spec) == RankSettings(False, "gloo")


def test_nccl_without_gpus_is_located(write_spec):
    path = write_spec(MINIMAL + "compute: {kind: torch_distributor, use_gpu: false, "
                      "backend: nccl}\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(["validate", path])
    assert status == 1
    assert f"{path}:8:61: compute.backend: nccl needs GPUs; use gloo, or use_gpu: true" \
        in out.getvalue()

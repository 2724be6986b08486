"""The content-addressed stage cache: undoing a ``--set`` reuses the earlier stages, the cache
is bounded, ``gc`` frees what is beyond the bound, ``plan`` says what is cached, and old
layouts are migrated without losing their stages."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from dbspec.errors import UsageError
from dbspec.executors.cache import StageCache, keep_from_env, read_state
from dbspec.executors.gc import collect_garbage, gc_command
from dbspec.executors.plan_status import plan_with_statuses, stage_statuses
from dbspec.executors.lock import RunLock
from dbspec.plan.render import render_json, render_text
from dbspec.spec.loader import load_spec
from tests.conftest import ROOT, run_in_process

DIABETES = str(ROOT / "specs" / "diabetes.yaml")
RUN_DIR = Path(".dbspec/runs/diabetes-regressor@dev-smoke")
LR = "training.optimizer.lr=0.03"


def _run(workdir: Path, *args: str, env: dict | None = None):
    return run_in_process("run", DIABETES, "--smoke", "--summary-json", "s.json", *args,
                          cwd=workdir, env=env)


def _summary(workdir: Path) -> dict:
    return json.loads((workdir / "s.json").read_text())


def _client(workdir: Path):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}")


def _mlflow_runs(workdir: Path) -> int:
    client = _client(workdir)
    return sum(len(client.search_runs([e.experiment_id]))
               for e in client.search_experiments())


@pytest.fixture(scope="module")
def undone(tmp_path_factory):
    """The smoke diabetes spec run as is, then with ``--set lr``, then as is again."""
    workdir = tmp_path_factory.mktemp("undo")
    saved = os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        summaries, counts = [], []
        for extra in ((), ("--set", LR), ()):
            result = _run(workdir, *extra)
            assert result.returncode == 0, result.stderr[-3000:]
            summaries.append(_summary(workdir))
            counts.append(_mlflow_runs(workdir))
        yield workdir, summaries, counts, result
    finally:
        if saved is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved


@pytest.fixture
def copied(undone, tmp_path, monkeypatch):
    """A private copy of the undo fixture's project (links kept), for tests that change it."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    workdir = tmp_path / "project"
    shutil.copytree(undone[0], workdir, symlinks=True)
    return workdir


def _actions(summary: dict) -> dict[str, str]:
    return {s["name"]: s["action"] for s in summary["stages"]}


def test_undoing_a_set_reuses_training(undone):
    workdir, (first, second, third), counts, result = undone
    assert _actions(second)["train"] == "ran" and second["run_id"] != first["run_id"]
    assert _actions(third)["train"] == "cached" and _actions(third)["evaluate"] == "cached"
    assert third["run_id"] == first["run_id"] and third["model_uri"] == first["model_uri"]
    assert counts[2] == counts[1]  # no new MLflow run
    versions = _client(workdir).search_model_versions("name='diabetes_predictor_smoke'")
    assert len(versions) == 2 and third["model_version"] == first["model_version"]
    assert "= train       reused from the cache" in result.stderr
    # the registry's current state is checked again, not replayed from the cache
    assert _actions(third)["promote"] == "ran"


def test_state_points_at_the_current_fingerprints(undone):
    workdir, (first, *_), _, _ = undone
    run_dir = workdir / RUN_DIR
    state = read_state(run_dir)
    assert state["layout"] == 2
    train = state["stages"]["train"]
    assert train["output"]["run_id"] == first["run_id"]
    link = run_dir / "stages" / "train"
    assert link.is_symlink() and Path(os.readlink(link)).name == train["fingerprint"]
    assert len(list((run_dir / "cache" / "train").glob("*.json"))) == 2


def test_plan_shows_cached_stale_and_new(undone, monkeypatch):
    workdir = undone[0]
    monkeypatch.chdir(workdir)
    loaded = load_spec(DIABETES)
    plan, statuses, note = plan_with_statuses(loaded, None, smoke=True)
    assert note is None and set(statuses.values()) == {"cached"}
    assert "status" in render_text(plan, statuses).splitlines()[1]
    changed = load_spec(DIABETES, assignments=["training.optimizer.lr=0.07"])
    plan, statuses, _ = plan_with_statuses(changed, None, smoke=True)
    assert [statuses[s] for s in ("preprocess", "train", "evaluate")] == \
        ["cached", "stale", "stale"]
    assert {s["name"]: s["status"] for s in json.loads(render_json(plan, statuses))["stages"]} \
        == statuses
    undo = load_spec(DIABETES, assignments=[LR])  # in the cache, not current
    _, statuses, _ = plan_with_statuses(undo, None, smoke=True)
    assert statuses["train"] == "cached" and statuses["promote"] == "stale"
    (workdir / "empty").mkdir()
    _, statuses, _ = plan_with_statuses(loaded, workdir / "empty", smoke=True)
    assert set(statuses.values()) == {"new"}


def test_plan_without_a_state_dir_has_no_status_column(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan, statuses, note = plan_with_statuses(load_spec(DIABETES), None)
    assert statuses is None and note is None
    assert "status" not in render_text(plan).splitlines()[1]


def test_plan_with_a_missing_state_dir_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="--state-dir .*: no such directory"):
        plan_with_statuses(load_spec(DIABETES), tmp_path / "absent")


def test_plan_status_is_unknown_when_the_data_version_cannot_be_resolved(tmp_path,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".dbspec").mkdir()
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: gone\ndata: {source: {kind: csv, path: missing.csv}, target: y, "
                    "task: regression}\nmodel: {layers: [{linear: {out: 1}}]}\n")
    plan, statuses, note = plan_with_statuses(load_spec(str(spec)), None)
    assert set(statuses.values()) == {"unknown"} and "missing.csv" in note


def test_the_bound_evicts_the_least_recently_used(copied):
    result = _run(copied, env={"DBSPEC_CACHE_KEEP": "1"})  # all current: nothing runs
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cache: " in result.stderr and "older entries removed" in result.stderr
    train = copied / RUN_DIR / "cache" / "train"
    current = read_state(copied / RUN_DIR)["stages"]["train"]["fingerprint"]
    assert sorted(p.name for p in train.iterdir()) == [current, f"{current}.json"]


def test_gc_dry_run_deletes_nothing(copied):
    before = sorted(str(p) for p in (copied / ".dbspec").rglob("*"))
    code, text = gc_command(copied / ".dbspec", spec_file=DIABETES, keep="1", dry_run=True)
    assert code == 0 and "would remove diabetes-regressor@dev-smoke/train/" in text
    assert "nothing deleted" in text
    assert sorted(str(p) for p in (copied / ".dbspec").rglob("*")) == before


def test_gc_frees_bytes_and_keeps_the_current_entries(copied):
    cache = copied / RUN_DIR / "cache"

    def size() -> int:
        return sum(p.lstat().st_size for p in cache.rglob("*") if not p.is_dir())

    before = size()
    report = collect_garbage(copied / ".dbspec", spec_name="diabetes-regressor", keep=1)
    assert report.freed > 0 and report.freed == before - size()
    assert {r.stage for r in report.removed} >= {"train", "evaluate"}
    state = read_state(copied / RUN_DIR)
    for name, entry in state["stages"].items():
        assert StageCache(copied / RUN_DIR).lookup(name, entry["fingerprint"]) is not None
    again = _run(copied)  # the current entries still serve a rerun
    assert again.returncode == 0 and re.search(r"stages run +none \(all unchanged\)", again.stdout)


def test_gc_skips_a_run_directory_a_live_run_holds(copied):
    lock = RunLock(copied / RUN_DIR).acquire("a test run")
    try:
        code, text = gc_command(copied / ".dbspec", spec_file=None, keep="1", dry_run=False)
    finally:
        lock.release()
    assert code == 1 and "skipped: dbspec gc" in text and "is already running" in text
    assert len(list((copied / RUN_DIR / "cache" / "train").glob("*.json"))) == 2


def test_gc_of_a_state_dir_without_runs_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no runs here"):
        collect_garbage(tmp_path, keep=1)


@pytest.mark.parametrize("value, message", [("0", "keep at least 1"),
                                            ("many", "expected a whole number")])
def test_bad_keep_counts_are_usage_errors(tmp_path, value, message):
    with pytest.raises(UsageError, match=message):
        gc_command(tmp_path, spec_file=None, keep=value, dry_run=True)
    with pytest.raises(UsageError, match=f"DBSPEC_CACHE_KEEP: .*{message}"):
        keep_from_env({"DBSPEC_CACHE_KEEP": value})
    assert keep_from_env({}) == 5


def test_a_bad_cache_bound_stops_the_run_before_any_work(workdir):
    result = run_in_process("run", DIABETES, "--smoke", cwd=workdir,
                            env={"DBSPEC_CACHE_KEEP": "-2"})
    assert result.returncode == 2 and "DBSPEC_CACHE_KEEP: -2" in result.stderr
    assert not (workdir / ".dbspec" / "runs").exists()


def test_a_state_from_before_the_cache_is_started_over(copied):
    """A state.json without the cache's layout (written by a dbspec that was never released)
    is not migrated: the run starts over, as for a damaged file."""
    run_dir = copied / RUN_DIR
    state = json.loads((run_dir / "state.json").read_text())
    del state["layout"]
    (run_dir / "state.json").write_text(json.dumps(state))
    assert read_state(run_dir) == {"stages": {}}

def test_eviction_keeps_current_drops_unfinished_and_ignores_broken_entries(tmp_path):
    cache = StageCache(tmp_path)
    for age, fingerprint in enumerate(("old", "mid", "new", "cur")):
        cache.prepare("train", fingerprint, keep_files=False)
        (cache.folder("train", fingerprint) / "model.bin").write_bytes(b"x" * 100)
        cache.record("train", {"fingerprint": fingerprint, "status": "done", "output": {}})
        entry = json.loads((tmp_path / "cache/train" / f"{fingerprint}.json").read_text())
        entry["used"] = age if fingerprint != "cur" else 0  # the current one, used long ago
        (tmp_path / "cache/train" / f"{fingerprint}.json").write_text(json.dumps(entry))
    cache.folder("train", "half").mkdir()  # a run killed before it finished, not current
    (tmp_path / "cache/train/broken").mkdir()
    (tmp_path / "cache/train/broken.json").write_text("{not json")
    assert cache.lookup("train", "broken") is None
    cache.point("train", "cur")
    state = {"stages": {"train": {"fingerprint": "cur", "status": "done"}}}
    dry = cache.evict(state, 2, dry_run=True)
    assert {r.fingerprint for r in dry} == {"old", "mid", "half", "broken"}
    assert cache.folder("train", "old").exists()
    removed = cache.evict(state, 2)
    assert {(r.fingerprint, r.reason) for r in removed} == {
        ("old", "evicted"), ("mid", "evicted"), ("half", "incomplete"), ("broken", "incomplete")}
    assert sorted(p.name for p in (tmp_path / "cache/train").iterdir()) == [
        "cur", "cur.json", "new", "new.json"]


def test_eviction_removes_the_partial_entries_of_dead_writers(tmp_path):
    cache = StageCache(tmp_path)
    cache.prepare("train", "f1", keep_files=False)
    dead = tmp_path / "cache/train/.f1.json.999999999-deadbeef.partial"
    live = tmp_path / f"cache/train/.f1.json.{os.getppid()}-cafecafe.partial"
    dead.write_text("{")
    live.write_text("{")
    cache.evict({"stages": {"train": {"fingerprint": "f1"}}}, 1)
    assert not dead.exists() and live.exists()


def test_a_kill_while_relinking_leaves_a_leftover_the_next_run_removes(tmp_path):
    cache = StageCache(tmp_path)
    cache.prepare("split", "f1", keep_files=False)
    leftover = tmp_path / "stages" / ".split.link-999999999-deadbeef"
    os.symlink("../cache/split/f1", leftover)
    cache.tidy()
    assert not os.path.lexists(leftover) and (tmp_path / "stages" / "split").is_dir()


def test_statuses_of_an_interrupted_stage_say_resumable(tmp_path):
    from dbspec.plan import compile_plan

    plan = compile_plan(load_spec(DIABETES).spec)
    first = plan.stages[0]
    cache = StageCache(tmp_path)
    cache.prepare(first.name, first.fingerprint, keep_files=False)
    (tmp_path / "state.json").write_text(json.dumps({"layout": 2, "stages": {
        first.name: {"fingerprint": first.fingerprint, "status": "failed", "output": {}}}}))
    statuses = stage_statuses(tmp_path, plan)
    assert statuses[first.name] == "resumable" and statuses["train"] == "new"


def test_an_entry_made_from_an_earlier_run_of_its_upstream_is_not_reused(tmp_path):
    """``--only train`` reruns train at the same fingerprint: a new MLflow run, so the
    evaluation kept for the old one must not be reused (its fingerprint alone cannot tell)."""
    from dbspec.executors.cache import inputs_of

    cache = StageCache(tmp_path)
    old_train = {"fingerprint": "t", "status": "done", "output": {"run_id": "r1"},
                 "finished_at": "2026-12-01T10:00:00Z"}
    new_train = {**old_train, "output": {"run_id": "r2"}, "finished_at": "2026-12-01T11:00:00Z"}
    cache.prepare("evaluate", "e", keep_files=False)
    cache.record("evaluate", {"fingerprint": "e", "status": "done", "output": {},
                              "inputs": inputs_of(["train"], {"train": old_train})})
    assert cache.lookup("evaluate", "e", inputs_of(["train"], {"train": old_train}))
    assert cache.lookup("evaluate", "e", inputs_of(["train"], {"train": new_train})) is None


def _kill_at(workdir: Path, point: str, *args: str) -> None:
    from tests.helpers.pause import kill_paused, run_until_paused

    process = run_until_paused(["run", DIABETES, "--smoke", "-q", *args], point,
                               workdir / "paused", cwd=workdir, timeout=180)
    kill_paused(process)


@pytest.mark.slow
def test_a_kill_after_a_stage_is_kept_reuses_it(copied):
    """Killed between writing train's cache entry and recording it done in state.json."""
    lr = "training.optimizer.lr=0.07"
    _kill_at(copied, "stage.train.kept", "--set", lr)
    state = read_state(copied / RUN_DIR)
    assert state["stages"]["train"]["status"] == "running"
    runs = _mlflow_runs(copied)
    result = _run(copied, "--set", lr)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "= train       reused from the cache" in result.stderr
    assert _mlflow_runs(copied) == runs  # the killed run's training is the one used


@pytest.mark.slow
def test_a_kill_after_relinking_a_reused_stage_is_repaired(copied):
    """Killed after ``stages/train`` was pointed at another fingerprint, before state.json
    said so: the next run must not read that fingerprint's files as its own."""
    run_dir = copied / RUN_DIR
    current = read_state(run_dir)["stages"]["train"]["fingerprint"]
    _kill_at(copied, "stage.train.reused", "--set", LR)
    assert Path(os.readlink(run_dir / "stages" / "train")).name != current
    result = _run(copied)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "= train       unchanged, skipped" in result.stderr
    assert Path(os.readlink(run_dir / "stages" / "train")).name == current

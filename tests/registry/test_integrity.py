"""The registry under ``kill -9`` and concurrency (issue 14, "Registry integrity").

Registry states are built directly with ``MlflowClient`` where no training is needed; the one
full run (killed inside ``register``, then resumed) uses a tiny spec. Kills land at named
:mod:`dbspec.faults` pause points, so each one hits its window deterministically.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import run_in_process
from tests.helpers.pause import kill_paused, run_until_paused
from tests.registry.conftest import NAME

SPEC = f"""\
name: integrity
data: {{source: {{kind: sklearn, name: diabetes}}, task: regression}}
model:
  layers:
    - linear: {{out: 8}}
    - relu
    - linear: {{out: 1}}
training: {{epochs: 3}}
tracking: {{system_metrics: false, monitor: false}}
registry:
  name: {NAME}
  promotion:
    alias: production
    gates:
      - {{metric: test_rmse, max: 100000}}
      - {{metric: test_rmse, better_than: production}}
"""

GATES = [{"metric": "test_rmse", "better_than": "production"}]


def add_version(client, tmp_path: Path, rmse: float, **tags: str) -> str:
    """A version of NAME with a logged test_rmse and the given tags (``dbspec.decision``...)."""
    version = client.create_model_version(NAME, str(tmp_path / "model"),
                                          tags={"metric.test_rmse": f"{rmse:g}", **tags})
    return str(version.version)


def cli(uri: str, *args: str):
    return run_in_process(*args, "--tracking-uri", uri)


def moves_of(registry, name: str, alias: str) -> list[dict]:
    """The alias's history as ``dbspec models`` shows it (the moves that happened)."""
    from dbspec.registry.commands import describe_models

    return describe_models(registry, name)["alias_history"][alias]


def holder_of(client, name: str, alias: str) -> str:
    return str(client.get_model_version_by_alias(name, alias).version)


def assert_chain(moves: list[dict], holder: str) -> None:
    """Each move starts where the one before ended, and the last one is where the alias is."""
    for before, after in zip(moves, moves[1:]):
        assert after["previous"] == before["version"], (before, after)
    assert moves[-1]["version"] == holder


def test_kill_inside_register_then_resume_adopts_the_orphan(workdir, empty_database):
    import mlflow

    (workdir / "spec.yaml").write_text(SPEC)
    (workdir / ".dbspec").mkdir()
    shutil.copy(empty_database, workdir / ".dbspec" / "mlflow.db")  # no migrations to wait for
    # the stages before register in this process (torch and MLflow are imported already);
    # the process that is killed only loads them from the state
    trained = run_in_process("run", "spec.yaml", "-q", "--only",
                             "load_data,split,preprocess,train,evaluate", cwd=workdir)
    assert trained.returncode == 0, trained.stderr
    paused = run_until_paused(["run", "spec.yaml", "-q"], "register.after_create",
                              workdir / "paused", cwd=workdir)
    kill_paused(paused)
    client = mlflow.MlflowClient(f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}")
    (orphan,) = client.search_model_versions(f"name = '{NAME}'")
    assert orphan.tags["dbspec.decision"] == "pending"  # never silently promotable
    assert json.loads(orphan.tags["dbspec.gates"])[1]["better_than"] == "production"
    # a pending version of another dead process (the killed one), not adoptable by this run
    stray = client.create_model_version(NAME, str(workdir), tags={
        "dbspec.decision": "pending", "dbspec.pending_owner": f"{socket.gethostname()}:"
                                                              f"{paused.pid}"})

    resumed = run_in_process("run", "spec.yaml", "--resume", cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert f"reused (same training run and model) {NAME} version {orphan.version}" \
        in resumed.stderr
    versions = {v.version: v for v in client.search_model_versions(f"name = '{NAME}'")}
    assert sorted(versions) == sorted([orphan.version, stray.version])  # no duplicate
    assert versions[orphan.version].tags["dbspec.decision"] == "promoted"
    assert "dbspec.gate.1" in versions[orphan.version].tags
    assert versions[stray.version].tags["dbspec.decision"] == "abandoned"
    assert client.get_model_version_by_alias(NAME, "production").version == orphan.version

    # registration is idempotent: rerunning evaluate, register alone or a finished run's
    # --resume gives the same training run and model the same version, not a new one
    for again in (["--from", "evaluate"], ["--only", "register"], ["--resume"]):
        rerun = run_in_process("run", "spec.yaml", *again, cwd=workdir)
        assert rerun.returncode == 0, rerun.stderr
    after = {v.version: v for v in client.search_model_versions(f"name = '{NAME}'")}
    assert sorted(after) == sorted(versions)
    assert after[orphan.version].tags["dbspec.decision"] == "promoted"
    assert client.get_model_version_by_alias(NAME, "production").version == orphan.version


def test_promote_of_an_undecided_version_reruns_its_gates(store, tmp_path):
    uri, client, _ = store
    champion = add_version(client, tmp_path, 55, **{"dbspec.decision": "promoted"})
    assert cli(uri, "promote", NAME, champion, "--alias", "production", "--force").returncode == 0
    gated = {"dbspec.decision": "pending", "dbspec.gates": json.dumps(GATES)}
    worse = add_version(client, tmp_path, 60, **gated)
    better = add_version(client, tmp_path, 50, **gated)
    bare = add_version(client, tmp_path, 40)  # an orphan of a register without gate records

    refused = cli(uri, "promote", NAME, worse, "--alias", "production")
    assert refused.returncode == 1 and "fails its gates: test_rmse=60 <= @production: FAIL" \
        in refused.stderr and "Traceback" not in refused.stderr
    assert client.get_model_version(NAME, worse).tags["dbspec.decision"] == "rejected"
    refused = cli(uri, "promote", NAME, bare, "--alias", "production")
    assert refused.returncode == 1 and f"v{bare} has no gate decision (none) and no gates " \
        "recorded" in refused.stderr and "--force" in refused.stderr
    assert str(client.get_model_version_by_alias(NAME, "production").version) == champion

    moved = cli(uri, "promote", NAME, better, "--alias", "production")
    assert moved.returncode == 0 and f"-> v{better} (was v{champion})" in moved.stdout
    assert client.get_model_version(NAME, better).tags["dbspec.decision"] == "promoted"
    assert cli(uri, "promote", NAME, bare, "--alias", "production", "--force").returncode == 0
    assert client.get_model_version(NAME, bare).tags["dbspec.decision"] == "forced"


@pytest.mark.parametrize("point", ["promote.before_move", "promote.after_move"])
def test_kill_around_the_alias_move_leaves_rollback_working(store, tmp_path, point):
    uri, client, registry = store
    versions = [add_version(client, tmp_path, rmse) for rmse in (60, 55, 50)]
    for version in versions[:2]:
        assert cli(uri, "promote", NAME, version, "--alias", "prod", "--force").returncode == 0
    paused = run_until_paused(["promote", NAME, versions[2], "--alias", "prod", "--force",
                               "--tracking-uri", uri], point, tmp_path / "paused")
    kill_paused(paused)
    moved = point == "promote.after_move"
    holder = versions[2] if moved else versions[1]
    assert holder_of(client, NAME, "prod") == holder
    shown = json.loads(cli(uri, "models", NAME, "--format", "json").stdout)
    assert [m["version"] for m in shown["alias_history"]["prod"]] == versions[:2 + moved]

    back = cli(uri, "rollback", NAME, "--alias", "prod")  # the lock died with the process
    expected = versions[1] if moved else versions[0]
    assert back.returncode == 0 and f"-> v{expected} (rolled back from v{holder})" in back.stdout
    again = cli(uri, "rollback", NAME, "--alias", "prod", "--to", expected)
    assert again.returncode == 1 and f"already points at v{expected}" in again.stderr


def test_concurrent_promote_rollback_pairs_keep_every_entry(store, tmp_path):
    from dbspec.registry import RegistryError
    from dbspec.registry.promotion import promote, rollback

    uri, client, registry = store
    versions = [add_version(client, tmp_path, 50 + i) for i in range(4)]
    # 45 earlier moves, so that with the pairs the history holds more than 50 entries
    earlier = [{"version": versions[i % 4], "previous": versions[(i - 1) % 4] if i else None,
                "at": "2026-01-01T00:00:00Z", "by": "x", "reason": "old", "applied": True}
               for i in range(45)]
    for i, entry in enumerate(earlier):
        client.set_registered_model_tag(NAME, f"dbspec.alias_history.prod.{i + 1:020d}-0000",
                                        json.dumps(entry))
    client.set_registered_model_alias(NAME, "prod", earlier[-1]["version"])
    moves, refusals, errors = [45], [], []

    def pair(index: int) -> None:
        try:
            if promote(registry, NAME, versions[index % 4], "prod", force=True).previous:
                moves.append(1)
            try:
                rollback(registry, NAME, "prod", None)
                moves.append(1)
            except RegistryError as exc:  # e.g. the earlier holder is the holder already
                refusals.append(str(exc))
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(repr(exc))

    threads = [threading.Thread(target=pair, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    assert all("already points at" in r or "no earlier holder" in r for r in refusals)
    entries = moves_of(registry, NAME, "prod")
    assert len(entries) == sum(moves) > 50  # no move without its entry, none cut off
    assert_chain(entries, holder_of(client, NAME, "prod"))


class SlowMoves:
    """A client whose alias moves take a while, so concurrent promotes overlap for sure."""

    def __init__(self, client, delays: dict[str, float]):
        self._client, self._delays = client, delays

    def __getattr__(self, name):
        return getattr(self._client, name)

    def set_registered_model_alias(self, name, alias, version):
        time.sleep(self._delays.get(str(version), 0))
        return self._client.set_registered_model_alias(name, alias, version)


def test_of_two_concurrent_promotes_the_worse_never_wins(store, tmp_path):
    from dbspec.registry import Registry, RegistryError
    from dbspec.registry.promotion import promote

    uri, client, registry = store
    gated = {"dbspec.decision": "pending", "dbspec.gates": json.dumps(GATES)}
    champion = add_version(client, tmp_path, 60)
    promote(registry, NAME, champion, "production", force=True)
    best, worse = add_version(client, tmp_path, 54.83, **gated), \
        add_version(client, tmp_path, 55.12, **gated)
    slow = Registry(SlowMoves(client, {best: 0.2, worse: 0.6}))
    start, outcomes = threading.Barrier(2), {}

    def race(version: str) -> None:
        start.wait()
        try:
            outcomes[version] = promote(slow, NAME, version, "production", force=False)
        except RegistryError as exc:
            outcomes[version] = str(exc)

    threads = [threading.Thread(target=race, args=(v,)) for v in (best, worse)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert holder_of(client, NAME, "production") == best, outcomes
    moves = moves_of(registry, NAME, "production")
    assert_chain(moves, best)
    rmse = {v: float(client.get_model_version(NAME, v).tags["metric.test_rmse"])
            for v in (champion, best, worse)}
    for move in moves[1:]:  # every gated move beat the holder it replaced
        assert rmse[move["version"]] <= rmse[move["previous"]]


def test_the_lock_orders_concurrent_moves_on_a_tracking_server(mlflow_server, tmp_path):
    """The host's registry lock for a store other than SQLite: 3 concurrent promote/rollback
    pairs on a real ``mlflow server`` keep a complete chain of history entries."""
    import mlflow

    from dbspec.registry import Registry, RegistryError
    from dbspec.registry.promotion import promote, rollback

    client = mlflow.MlflowClient(mlflow_server.uri)
    name = f"lease_{time.time_ns()}"
    client.create_registered_model(name)
    run = client.create_run("0").info.run_id
    versions = [str(client.create_model_version(name, f"runs:/{run}/model", run_id=run).version)
                for _ in range(3)]
    registry = Registry(client)
    errors = []

    def pair(index: int) -> None:
        try:
            promote(registry, name, versions[index % 3], "prod", force=True)
            try:
                rollback(registry, name, "prod", None)
            except RegistryError as exc:
                assert "already points at" in str(exc) or "no earlier holder" in str(exc)
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(repr(exc))

    threads = [threading.Thread(target=pair, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    entries = moves_of(registry, name, "prod")
    assert len(entries) >= 3
    assert_chain(entries, holder_of(client, name, "prod"))
    registry.lock_wait_s = 0.0
    with registry.lock(name):  # released: taken again at once
        pass


def test_a_holder_changed_under_the_move_is_decided_again(store, tmp_path):
    """The re-read before the move: a writer that does not take the lock (the UI) moves the
    alias while the gate is being decided; the decision is taken again on the new holder."""
    from dbspec.registry import AliasDecision

    uri, client, registry = store
    one, two, three = (add_version(client, tmp_path, rmse) for rmse in (60, 50, 55))
    registry.move_alias(NAME, "production", one, reason="first")
    seen_holders = []

    def decide(seen):
        seen_holders.append(seen.holder("production"))
        if len(seen_holders) == 1:  # meanwhile, elsewhere: v2 (rmse 50) is put in place
            client.set_registered_model_alias(NAME, "production", two)
        beats = 55 <= float(client.get_model_version(NAME, seen.holder("production")).tags[
            "metric.test_rmse"])
        return AliasDecision(three if beats else None, "test", detail=beats)

    outcome = registry.guarded_move(NAME, "production", decide)
    assert seen_holders == [one, two] and outcome.moved is False and outcome.decision.detail \
        is False
    assert holder_of(client, NAME, "production") == two


def test_register_adopts_its_runs_abandoned_version_and_abandons_dead_ones(store, tmp_path):
    import subprocess
    import sys

    uri, client, registry = store
    source = str(tmp_path / "model")
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    dead = f"{socket.gethostname()}:{exited.pid}"
    mine = add_version(client, tmp_path, 50, **{"dbspec.run_id": "r1", "dbspec.decision":
                                                "abandoned", "dbspec.abandoned": "earlier"})
    theirs = add_version(client, tmp_path, 50, **{"dbspec.run_id": "r0", "dbspec.decision":
                                                  "pending", "dbspec.pending_owner": dead})
    decided = add_version(client, tmp_path, 50, **{"dbspec.run_id": "r1", "dbspec.decision":
                                                   "rejected"})
    registered = registry.register(NAME, source, "r1", {"metric.test_rmse": "49"})
    assert (registered.version, registered.adopted, registered.abandoned) == (mine, True,
                                                                               (theirs,))
    tags = client.get_model_version(NAME, mine).tags
    assert tags["dbspec.decision"] == "pending" and "dbspec.abandoned" not in tags
    assert tags["metric.test_rmse"] == "49"
    assert client.get_model_version(NAME, theirs).tags["dbspec.decision"] == "abandoned"
    assert client.get_model_version(NAME, decided).tags["dbspec.decision"] == "rejected"
    again = registry.register(NAME, source, "r2", {})  # another run: a new version, pending
    assert not again.adopted and client.get_model_version(NAME, again.version).tags[
        "dbspec.decision"] == "pending"

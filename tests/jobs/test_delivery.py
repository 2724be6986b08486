"""How dbspec reaches Databricks (issue 32): a bundle whose ``artifacts`` entry builds the wheel
its tasks install, and syncs it although ``dist/`` is ignored; a pinned requirement when dbspec
came from a package index; the jobs-json format's ``deploy.sh``.

The wheel is really built, from a copy of this checkout as a fresh clone has it (a build leaves
``build/`` and ``dbspec.egg-info`` behind, which must not land in the checkout under test). No
Databricks workspace can run here, so ``deploy.sh`` runs against a stand-in ``databricks``
command that records its arguments and answers ``jobs list`` / ``jobs create`` as the CLI
does; what it checks is the commands, their order and the files they name.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import MINIMAL, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel")]

SPEC = MINIMAL + "registry: {name: main.ml.minimal}\n"


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """dbspec's sources as a clone has them (package, pyproject.toml, README.md)."""
    root = tmp_path_factory.mktemp("clone") / "dbspec-src"
    shutil.copytree(ROOT / "dbspec", root / "dbspec",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, root / name)
    return root


def jobs(source: Path, spec: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m dbspec jobs`` with dbspec imported from ``source``."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    done = subprocess.run([sys.executable, "-m", "dbspec", "jobs", str(spec), "-o", str(out),
                           *args], env=env, capture_output=True, text=True, timeout=120,
                          cwd=spec.parent)
    assert done.returncode == 0, done.stderr
    return done


def test_the_bundle_builds_and_uploads_the_wheel_its_tasks_install(clone, tmp_path):
    from dbspec.jobs.delivery import WHEEL

    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "bundle"
    printed = jobs(clone, spec, out).stdout
    assert f"deploy: cd {out} && databricks bundle deploy" in printed
    root = yaml.safe_load((out / "databricks.yml").read_text())
    artifact = root["artifacts"]["dbspec"]
    assert artifact["type"] == "whl" and artifact["path"] == "."
    assert root["sync"] == {"include": ["dist/*.whl"]}  # dist/ is git-ignored; sync skips it
    # the build command, run where the CLI runs it, makes the very file the tasks install
    subprocess.run(artifact["build"], shell=True, cwd=out / artifact["path"], check=True,
                   timeout=300)
    (built,) = artifact["files"]
    assert (out / built["source"]).is_file() and built["source"] == f"dist/{WHEEL}"
    (resource,) = (out / "resources").glob("*.yml")
    (target,) = yaml.safe_load(resource.read_text())["targets"].values()
    (job,) = target["resources"]["jobs"].values()
    for task in job["tasks"]:
        wheel = task["libraries"][0]["whl"]  # relative to the resource file
        assert (resource.parent / wheel).resolve() == (out / built["source"]).resolve()

    # the same wheel installed from an index (no checkout beside it): a pinned requirement
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(site), str(out / built["source"])], check=True, timeout=300)
    pinned = tmp_path / "pinned"
    assert "the tasks install 'dbspec==0.1.0'" in jobs(site, spec, pinned).stderr
    root = yaml.safe_load((pinned / "databricks.yml").read_text())
    assert "artifacts" not in root and "sync" not in root
    (resource,) = (pinned / "resources").glob("*.yml")
    text = resource.read_text()
    assert "pypi:\n                package: dbspec==0.1.0" in text and "whl:" not in text


def _stand_in_cli(bin_dir: Path, log: Path, jobs_file: Path) -> None:
    """A ``databricks`` command that logs its arguments and keeps created jobs in a file."""
    bin_dir.mkdir()
    script = bin_dir / "databricks"
    script.write_text(f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
with open({str(log)!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
try:
    jobs = json.load(open({str(jobs_file)!r}))
except FileNotFoundError:
    jobs = []
if args[:2] == ["jobs", "list"]:
    print(json.dumps([j for j in jobs if j["settings"]["name"] == args[3]]))
elif args[:2] == ["jobs", "create"]:
    body = json.loads(args[args.index("--json") + 1])
    jobs.append({{"job_id": 100 + len(jobs), "settings": body}})
    json.dump(jobs, open({str(jobs_file)!r}, "w"))
    print(json.dumps({{"job_id": jobs[-1]["job_id"]}}))
elif args[:2] == ["jobs", "get-permissions"]:  # the creator owns it, beside the direct grants
    (job,) = [j for j in jobs if j["job_id"] == int(args[2])]
    granted = job["settings"].get("access_control_list") or []
    print(json.dumps({{"object_id": f"/jobs/{{args[2]}}", "access_control_list": [
        {{"user_name": "deployer@example.com",
         "all_permissions": [{{"permission_level": "IS_OWNER", "inherited": False}}]}},
        {{"group_name": "admins",
         "all_permissions": [{{"permission_level": "CAN_MANAGE", "inherited": True}}]}}] + [
        {{**{{k: v for k, v in g.items() if k != "permission_level"}},
         "all_permissions": [{{"permission_level": g["permission_level"], "inherited": False}}]}}
        for g in granted]}}))
else:
    print("{{}}")
""")
    script.chmod(0o755)


def test_deploy_sh_uploads_the_wheel_and_spec_then_creates_or_resets_each_job(clone, tmp_path):
    from dbspec.jobs.delivery import WHEEL

    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC + "jobs: {workspace_root: /Workspace/Shared/team/dbspec}\n"
                    "roles: {admin: [ml-admins]}\ntargets: {dev: {}, prod: {mode: production}}\n")
    out = tmp_path / "json"
    assert f"deploy: bash {out / 'deploy.sh'}" in jobs(clone, spec, out, "--format",
                                                       "jobs-json").stdout
    dev, prod = (json.loads(f.read_text()) for f in sorted(out.glob("*.json")))
    assert dev["name"] == prod["name"]  # one name, two jobs: told apart by the target tag
    body = prod
    assert body["tasks"][0]["libraries"][0]["whl"] == f"/Workspace/Shared/team/dbspec/dist/{WHEEL}"
    assert body["tasks"][0]["python_wheel_task"]["parameters"][1] == \
        "/Workspace/Shared/team/dbspec/specs/spec.yaml"
    assert (out / "specs" / "spec.yaml").read_text().endswith(spec.read_text())
    log, store = tmp_path / "calls.jsonl", tmp_path / "jobs.json"
    _stand_in_cli(tmp_path / "bin", log, store)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    for _ in range(2):  # first deploy creates, the second updates the same job
        done = subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    assert (out / "dist" / WHEEL).is_file()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    imports = {c[2]: c[4] for c in calls if c[:2] == ["workspace", "import"]}
    assert imports == {f"/Shared/team/dbspec/dist/{WHEEL}": f"dist/{WHEEL}",
                       "/Shared/team/dbspec/specs/spec.yaml": "specs/spec.yaml"}
    verbs = [c[1] for c in calls if c[0] == "jobs"]
    assert verbs == ["list", "create"] * 2 + ["list", "reset", "get-permissions",
                                              "set-permissions"] * 2, verbs
    resets = [json.loads(c[c.index("--json") + 1]) for c in calls if c[:2] == ["jobs", "reset"]]
    assert [r["job_id"] for r in resets] == [100, 101]  # each target's own job, both kept
    assert [r["new_settings"]["tags"]["dbspec_target"] for r in resets] == ["dev", "prod"]
    assert "access_control_list" not in resets[1]["new_settings"]  # set-permissions sets it
    assert json.loads(store.read_text())[1]["settings"]["access_control_list"] == \
        body["access_control_list"]
    sets = [json.loads(c[c.index("--json") + 1])["access_control_list"] for c in calls
            if c[:2] == ["jobs", "set-permissions"]]
    owner = {"user_name": "deployer@example.com", "permission_level": "IS_OWNER"}
    assert sets[1] == body["access_control_list"] + [owner]  # the owner is kept

    # the roles leave the spec: the next deploy takes their grants back, the owner stays
    spec.write_text(SPEC + "jobs: {workspace_root: /Workspace/Shared/team/dbspec}\n"
                    "targets: {dev: {}, prod: {mode: production}}\n")
    jobs(clone, spec, out, "--format", "jobs-json")
    done = subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    sets = [json.loads(c[c.index("--json") + 1])["access_control_list"] for c in calls
            if c[:2] == ["jobs", "set-permissions"]]
    assert sets[-2:] == [[owner], [owner]]


LOOP = MINIMAL + """\
registry: {name: main.ml.minimal, promotion: {alias: champion}}
monitoring: {table: /Volumes/main/ml/serving/inference, lookback: 2h, on_alert: rollback,
             retrain: true}
"""


def test_deploy_sh_puts_the_ids_of_the_jobs_it_deployed_into_the_bodies_that_name_them(
        clone, tmp_path):
    """A Jobs API body cannot name another job by a bundle reference: the monitor job's retrain
    and rollback and the main job's link task carry placeholders, which deploy.sh replaces with
    the ids of the jobs it created (first deploy) or reset (second) before them."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(LOOP)
    out = tmp_path / "json"
    jobs(clone, spec, out, "--format", "jobs-json")
    monitor = json.loads((out / "minimal_monitor.default.json").read_text())
    retrain = next(t for t in monitor["tasks"] if t["task_key"] == "retrain")
    assert retrain["run_job_task"]["job_id"] == "${dbspec.jobs.minimal.default.id}"
    log, store = tmp_path / "calls.jsonl", tmp_path / "jobs.json"
    _stand_in_cli(tmp_path / "bin", log, store)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    for _ in range(2):
        done = subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    created = {j["settings"]["name"]: j for j in json.loads(store.read_text())}
    ids = {name: job["job_id"] for name, job in created.items()}
    assert list(ids) == ["minimal deployment", "minimal", "minimal monitor"]  # dependency order
    tasks = {t["task_key"]: t for t in created["minimal monitor"]["settings"]["tasks"]}
    assert tasks["retrain"]["run_job_task"]["job_id"] == ids["minimal"]
    assert tasks["rollback"]["run_job_task"]["job_id"] == ids["minimal deployment"]
    link = created["minimal"]["settings"]["tasks"][0]["python_wheel_task"]["parameters"]
    assert link == ["link-job", "main.ml.minimal", str(ids["minimal deployment"])]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    resets = [json.loads(c[c.index("--json") + 1]) for c in calls if c[:2] == ["jobs", "reset"]]
    by_id = {r["job_id"]: r["new_settings"] for r in resets}
    assert "${dbspec" not in json.dumps(by_id) and len(by_id) == 3
    tasks = {t["task_key"]: t for t in by_id[ids["minimal monitor"]]["tasks"]}
    assert tasks["retrain"]["run_job_task"]["job_id"] == ids["minimal"]

    # a body naming a job that was not deployed before it is refused, naming both
    from dbspec.jobs.delivery import UPSERT

    empty = tmp_path / "ids.json"
    empty.write_text("{}")
    refused = subprocess.run(["python3", "-", "minimal_monitor.default.json", "minimal monitor",
                              "default", str(empty)], input=UPSERT, cwd=out, env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1
    assert "minimal_monitor.default.json: job minimal.default is not among the " \
           "jobs deployed before it" in refused.stderr

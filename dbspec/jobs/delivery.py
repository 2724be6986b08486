"""How a generated job gets dbspec onto Databricks, and the files and commands that take it
there: built as a wheel from the checkout dbspec runs from (a bundle ``artifacts`` entry, or the
jobs-json ``deploy.sh``), or, when dbspec came from a package index, pinned by version.

``deploy.sh`` uses the Databricks CLI (``databricks workspace import`` / ``databricks fs cp``,
``databricks jobs create`` / ``reset``): what a bundle deploy does, for the Jobs API format. A
body names another job by a placeholder, ``${dbspec.jobs.<key>.<target>.id}``, which it replaces
with the id of the job it created or reset before (jobs are deployed in dependency order).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path, PurePosixPath
from typing import NamedTuple, Optional

from dbspec import __version__

WHEEL = f"dbspec-{__version__}-py3-none-any.whl"


class Delivery(NamedTuple):
    """Where the wheel comes from: ``checkout`` (relative to the output directory), or None and
    tasks install ``pinned`` (from the index, or the VCS URL dbspec was installed from)."""

    checkout: Optional[str]
    pinned: str = f"dbspec=={__version__}"

    def library(self, folder: str) -> str:
        """What a task installs: the wheel in ``folder``, or the pinned requirement."""
        return f"{folder}/{WHEEL}" if self.checkout else self.pinned

    def build(self, wheel_dir: str) -> str:
        """The command that builds the wheel into ``wheel_dir`` (run in the output directory)."""
        return (f"python3 -m pip wheel --quiet --no-deps --wheel-dir {wheel_dir} "
                f"{shlex.quote(str(self.checkout))}")


def delivery(output: Optional[str]) -> Delivery:
    """How ``dbspec`` reaches the cluster: built from the source checkout it is imported from
    (a ``pyproject.toml`` naming dbspec beside the package) or was installed from (PEP 610's
    ``direct_url.json``), pinned to the VCS commit it came from, else to its version."""
    import importlib.metadata
    import json
    from urllib.parse import unquote, urlparse

    import dbspec

    try:
        direct = json.loads(importlib.metadata.distribution("dbspec")
                            .read_text("direct_url.json") or "{}")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        direct = {}
    url = str(direct.get("url", ""))
    roots = [Path(dbspec.__file__).resolve().parents[1]]
    if "dir_info" in direct:
        roots.append(Path(unquote(str(urlparse(url).path))))
    for root in roots:
        pyproject = root / "pyproject.toml"
        if pyproject.is_file() and 'name = "dbspec"' in pyproject.read_text(encoding="utf-8"):
            base = Path(output or ".").resolve()
            return Delivery(Path(os.path.relpath(root, base)).as_posix())
    vcs = direct.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("commit_id"):
        return Delivery(None, f"dbspec @ {vcs.get('vcs', 'git')}+{url}@{vcs['commit_id']}")
    return Delivery(None)


def bundle_artifacts(how: Delivery) -> dict:
    """``artifacts`` and ``sync`` of ``databricks.yml``: the wheel built into the bundle's
    ``dist/`` at deploy, and uploaded with the files although ``dist/`` is usually ignored."""
    if how.checkout is None:
        return {}
    return {"artifacts": {"dbspec": {"type": "whl", "path": ".", "build": how.build("dist"),
                                     "files": [{"source": f"dist/{WHEEL}"}]}},
            "sync": {"include": ["dist/*.whl"]}}


def deploy_script(how: Delivery, *, root: str, uploads: list[str],
                  jobs: list[tuple[str, str, str]], header: str) -> str:
    """``deploy.sh`` of the jobs-json format: build the wheel, upload it and ``uploads`` (paths
    relative to the output directory) under ``root``, then create each job in ``jobs`` (body
    file, job name, target), or reset the job of that name and target to the body, its
    placeholders replaced by the ids of the jobs before it."""
    lines = [f"#!/usr/bin/env bash\n{header}",
             f"# Uploads what the jobs read to {root} and creates or updates each job with the",
             "# Databricks CLI (authenticate first: databricks auth login, or DATABRICKS_HOST and",
             "# DATABRICKS_TOKEN; DATABRICKS_CONFIG_PROFILE picks a profile).",
             "set -euo pipefail", 'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
             'cd "$here"', 'ids="$(mktemp)"  # the ids of the jobs deployed so far',
             'trap \'rm -f "$ids"\' EXIT', 'echo \'{}\' > "$ids"']
    files = list(uploads)
    if how.checkout is not None:
        lines.append(how.build("dist"))
        files.insert(0, f"dist/{WHEEL}")
    for folder in sorted({str(PurePosixPath(f).parent) for f in files}):
        lines.append(_mkdirs(f"{root}/{folder}"))
    lines += [_upload(f, f"{root}/{f}") for f in files]
    for body, name, target in jobs:
        lines.append(f"python3 - {shlex.quote(body)} {shlex.quote(name)} {shlex.quote(target)} "
                     f"\"$ids\" <<'PY'\n{UPSERT}PY")
    return "\n".join(lines) + "\n"


def _mkdirs(path: str) -> str:
    if path.startswith("/Workspace/"):
        return f"databricks workspace mkdirs {shlex.quote(path.removeprefix('/Workspace'))}"
    return f"databricks fs mkdir {shlex.quote(_dbfs(path))}"


def _upload(local: str, remote: str) -> str:
    if remote.startswith("/Workspace/"):
        return (f"databricks workspace import {shlex.quote(remote.removeprefix('/Workspace'))} "
                f"--file {shlex.quote(local)} --format AUTO --overwrite")
    return f"databricks fs cp --overwrite {shlex.quote(local)} {shlex.quote(_dbfs(remote))}"


def _dbfs(path: str) -> str:
    return path if path.startswith("dbfs:") else f"dbfs:{path}"


#: Create the job of a body file, or reset the job of its name to it (and its permissions).
UPSERT = """\
import json, re, subprocess, sys
body_file, name, target, ids_file = sys.argv[1:]  # one job per target: by name and target tag
ids = json.load(open(ids_file))  # body file stem -> id of the jobs deployed before this one
def resolve(value, key=None):
    if isinstance(value, dict):
        return {k: resolve(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v) for v in value]
    if not isinstance(value, str):
        return value
    for ref in re.findall(r"[$][{]dbspec[.]jobs[.]([^}]+)[.]id[}]", value):
        if ref not in ids:
            sys.exit(f"{body_file}: job {ref} is not among the jobs deployed before it")
        value = value.replace("${dbspec.jobs.%s.id}" % ref, str(ids[ref]))
    return int(value) if key == "job_id" and value.isdigit() else value
body = resolve(json.load(open(body_file)))
acl = body.pop("access_control_list", None)
def cli(*args):
    done = subprocess.run(["databricks", *args, "--output", "json"], check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout or "null")
found = [j for j in cli("jobs", "list", "--name", name) or []
         if j.get("settings", {}).get("name") == name
         and (j["settings"].get("tags") or {}).get("dbspec_target", "default") == target]
if len(found) > 1:
    sys.exit(f"{len(found)} jobs are named {name!r} (target {target}); delete all but one")
if found:
    job_id = found[0]["job_id"]
    cli("jobs", "reset", "--json", json.dumps({"job_id": job_id, "new_settings": body}))
    # the spec's list replaces the job's own (a principal dropped from the spec loses access);
    # the owner stays unless the spec names one: a job has one
    acl = acl or []
    if not any(a.get("permission_level") == "IS_OWNER" for a in acl):
        held = cli("jobs", "get-permissions", str(job_id)) or {}
        acl = acl + [{**{k: e[k] for k in ("user_name", "group_name", "service_principal_name")
                         if e.get(k)}, "permission_level": "IS_OWNER"}
                     for e in held.get("access_control_list") or []
                     if any(p.get("permission_level") == "IS_OWNER" and not p.get("inherited")
                            for p in e.get("all_permissions") or [])]
    cli("jobs", "set-permissions", str(job_id), "--json", json.dumps({"access_control_list": acl}))
    print(f"updated job {job_id}: {name}")
else:
    if acl:
        body["access_control_list"] = acl
    job_id = cli("jobs", "create", "--json", json.dumps(body))["job_id"]
    print(f"created job {job_id}: {name}")
ids[body_file.removesuffix(".json")] = job_id
json.dump(ids, open(ids_file, "w"))
"""

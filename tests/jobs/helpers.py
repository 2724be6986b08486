"""``dbspec jobs`` run in this process: the same ``main`` a console run calls, without paying a
fresh interpreter per call (tests/test_architecture.py runs ``jobs`` in a subprocess and checks
it imports nothing heavy; test_jobs keeps one real subprocess run)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess

from tests.conftest import ROOT


def jobs_cli(*args: str) -> subprocess.CompletedProcess:
    """``dbspec jobs ARGS`` in process, as a CompletedProcess (return code, stdout, stderr)."""
    from dbspec.cli import main

    out, err = io.StringIO(), io.StringIO()
    before = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
    try:
        with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            try:
                code = main(["jobs", *args])
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        if before is None:
            os.environ.pop("PYDANTIC_DISABLE_PLUGINS", None)
        else:
            os.environ["PYDANTIC_DISABLE_PLUGINS"] = before
    return subprocess.CompletedProcess(["dbspec", "jobs", *args], code, out.getvalue(),
                                       err.getvalue())


#: databricks-bundles, the Python classes of bundle resources; installed for the tests that use
#: it into a temporary folder, without its dependencies (databricks-sdk is dbspec's own).
BUNDLES = "databricks-bundles==1.22.1"


def bundles_round_trip(folder, jobs: list[dict]) -> None:
    """Every job loads into databricks-bundles' ``Job`` and comes back unchanged (nothing the
    class would drop or refuse), checked in a subprocess with the package in ``folder``."""
    import json
    import sys

    if not (folder / "databricks" / "bundles").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--target", str(folder), BUNDLES], check=True, timeout=600)
    check = ("import json, sys\nfrom databricks.bundles.jobs import Job\n"
             "for job in json.load(sys.stdin):\n"
             "    assert Job.from_dict(job).as_dict() == job, job\nprint('ok')\n")
    done = subprocess.run([sys.executable, "-c", check], input=json.dumps(jobs), text=True,
                          capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(folder)})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def with_job_ids(job: dict) -> dict:
    """``job`` as the Jobs API receives it: each ``run_job_task`` names another job by a
    reference (``${resources.jobs.<key>.id}``, or jobs-json's ``${dbspec.jobs.<key>.id}``)
    that ``databricks bundle deploy`` or ``deploy.sh`` replaces with the job's id, an integer
    (databricks-sdk's ``RunJobTask.job_id`` holds nothing else)."""
    import json
    import re

    text = re.sub(r'"job_id": "\$\{(resources|dbspec)\.jobs\.[^}]+\.id\}"', '"job_id": 1',
                  json.dumps(job))
    return json.loads(text)

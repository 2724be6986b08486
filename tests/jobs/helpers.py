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

"""What a failed stage tells the user: the cause, and how to go on from where it stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from dbspec.errors import DbspecError


def failure_message(spec: Any, name: str, exc: BaseException, directory: Path,
                    resume_command: Optional[str]) -> str:
    """``stage 'NAME' failed: CAUSE`` and a hint to fix and resume (finished stages are kept).

    A data error is fixed in the data or the spec, so the same command runs again; a
    refusal of the tracking server names the permission; anything unexpected points at the
    stage's ``error.txt`` with its traceback.
    """
    from dbspec.data.sources import DataError
    from dbspec.registry.errors import is_permission_denied

    resume = f"\n  resume with: {resume_command} --resume" if resume_command else ""
    if isinstance(exc, DataError):
        cause = str(exc)
        resume = ("\n  fix the data or the spec (or its --set values), then run again; "
                  "finished stages are kept" + (f": {resume_command}" if resume_command else ""))
    elif isinstance(exc, DbspecError):
        cause = str(exc)
    elif is_permission_denied(exc):  # a tracking server with auth refused its user
        cause = _refusal(spec, name, exc)
        resume = resume.replace("resume with", "then resume with")
    else:
        cause = f"{type(exc).__name__}: {exc} (traceback in {directory / 'error.txt'})"
    return f"stage '{name}' failed: {cause}{resume}"


def _refusal(spec: Any, stage: str, exc: BaseException) -> str:
    """Who may not do what in ``stage``, and the permission it takes (roles, README)."""
    from dbspec.registry.errors import denied

    if stage in ("register", "promote"):
        what, needs = f"registered model '{spec.registry.name}'", "EDIT on the registered model"
    else:
        what = f"experiment '{spec.tracking.experiment or spec.name}'"
        needs = "EDIT on the experiment (roles.data_scientist or roles.admin)"
    return str(denied(exc, f"write the {stage} stage's results to the {what}", needs))

"""``dbspec gc``: evict the stage cache entries beyond the bound, on demand (a run does it
for its own run directory when it ends: :meth:`~dbspec.executors.state.LocalState.evict`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from dbspec.errors import UsageError
from dbspec.executors.cache import (Removal, StageCache, check_keep, keep_from_env,
                                    read_state)


@dataclass
class CacheReport:
    """What :func:`collect_garbage` did (or, with ``dry_run``, would do)."""

    removed: list[Removal] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # run dirs a live run holds
    dry_run: bool = False

    @property
    def freed(self) -> int:
        return sum(r.bytes for r in self.removed)


def collect_garbage(state_dir: Path, *, spec_name: Optional[str] = None, keep: int,
                    dry_run: bool = False) -> CacheReport:
    """Evict, in every run directory of ``state_dir`` (or of ``spec_name``: its targets and
    ``--smoke`` runs too), the cache entries beyond ``keep`` per stage. Each run directory is
    locked while it is cleaned; one a live run holds is skipped and named in the report.

    Raises:
        UsageError: ``keep`` is below 1, or ``state_dir`` has no runs.
    """
    from dbspec.executors.lock import RunLock, RunLocked

    keep = check_keep(keep, "--keep")
    runs = Path(state_dir) / "runs"
    if not runs.is_dir():
        raise UsageError(f"{state_dir}: no runs here (no {runs}); give the --state-dir that "
                         "`dbspec run` used")
    report = CacheReport(dry_run=dry_run)
    for run_dir in sorted(p for p in runs.iterdir() if p.is_dir()):
        base = run_dir.name.removesuffix("-smoke").split("@", 1)[0]
        if spec_name is not None and spec_name not in (base, run_dir.name):
            continue
        lock = RunLock(run_dir)
        try:
            if not dry_run:  # a dry run deletes nothing: it need not wait for a run
                lock.acquire(f"dbspec gc {run_dir.name}")
        except RunLocked as exc:
            report.skipped.append(str(exc))
            continue
        try:
            state = read_state(run_dir)
            report.removed += StageCache(run_dir).evict(state, keep, dry_run=dry_run)
        finally:
            lock.release()
    if not report.skipped:  # a live run may be about to record a set it just converted
        report.removed += _unused_shard_sets(Path(state_dir), dry_run=dry_run)
    return report


def _unused_shard_sets(state_dir: Path, *, dry_run: bool) -> list[Removal]:
    """The streamed-data shard sets under ``<state dir>/shards`` that no kept ``load_data``
    entry of any run names (``data.streaming``; sets elsewhere, in a shared location other
    projects may use, are left alone), those that contradict their index, and conversions a
    kill left half-written."""
    import json
    import shutil

    folder = state_dir / "shards"
    if not folder.is_dir():
        return []
    named = set()
    for entry in (state_dir / "runs").glob("*/cache/load_data/*.json"):
        try:
            shards = json.loads(entry.read_text()).get("output", {}).get("shards")
        except (OSError, ValueError, AttributeError):
            return []  # an entry this gc cannot read might name any set: keep them all
        if shards:
            named.add(Path(shards).name)
    removed = []
    for path in sorted(folder.iterdir()):
        if not path.is_dir() or not path.name.startswith(("shards-", ".partial-")):
            continue
        reason = "incomplete" if path.name.startswith(".partial-") else \
            "unreferenced" if path.name not in named else _broken(path)
        if reason is None:
            continue
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        removed.append(Removal(state_dir, "shards", path.name, size, reason))
        if not dry_run:
            shutil.rmtree(path, ignore_errors=True)
    return removed


def _broken(path: Path) -> Optional[str]:
    """``broken: <why>`` for a shard set that contradicts its index (its run converts the
    source again), else None."""
    from dbspec.data.shards import BrokenShardSet, open_shard_set

    try:
        open_shard_set(path)
    except BrokenShardSet as exc:
        return f"broken: {exc.problem.removeprefix(f'the shard set at {path} ')}"
    return None


def gc_command(state_dir: Path, *, spec_file: Optional[str], keep: Optional[str],
               dry_run: bool) -> tuple[int, str]:
    """``dbspec gc [SPEC] [--keep N] [--dry-run]``: returns the exit code and the report (1
    when a live run held a run directory, which was skipped).

    Raises:
        UsageError: a bad ``--keep`` or ``DBSPEC_CACHE_KEEP``, or no runs in ``state_dir``.
        SpecError: ``spec_file`` is not a valid spec.
    """
    count = keep_from_env() if keep is None else check_keep(keep, "--keep")
    spec_name = None
    if spec_file is not None:
        from dbspec.spec.loader import load_spec

        spec_name = load_spec(spec_file).spec.name
    report = collect_garbage(Path(state_dir), spec_name=spec_name, keep=count, dry_run=dry_run)
    return (1 if report.skipped else 0), render_report(report, keep=count)


def render_report(report: CacheReport, *, keep: int) -> str:
    """One line per removed entry and a total, for ``dbspec gc``."""
    verb = "would remove" if report.dry_run else "removed"
    lines = [f"{verb} {r.run_dir.name}/{r.stage}/{r.fingerprint} ({_human(r.bytes)}, "
             f"{r.reason})" for r in report.removed]
    lines += [f"skipped: {why}" for why in report.skipped]
    total = (f"gc: {len(report.removed)} entries, {_human(report.freed)} "
             + ("would be freed (--dry-run: nothing deleted)" if report.dry_run else "freed")
             + f"; at most {keep} kept per stage")
    return "\n".join(lines + [total])


def _human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"

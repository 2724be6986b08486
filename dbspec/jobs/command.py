"""``dbspec jobs``: write the generated files, or with ``--check`` compare them."""

from __future__ import annotations

import sys
from pathlib import Path

from dbspec.errors import UsageError
from dbspec.jobs.files import GENERATED, NOT_OURS, check, write
from dbspec.jobs.generate import generate


def run_jobs(args) -> int:
    """The ``jobs`` command: write the files, or with ``--check`` compare them."""
    files, warnings = generate(args.file, targets=args.targets, assignments=args.assignments,
                               fmt=args.format, output=args.output)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    directory = Path(args.output)
    patterns = GENERATED[args.format]
    if args.check:
        found = check(directory, files, patterns)
        for line in found.lines():
            print(line)
        print(found.verdict(), file=sys.stdout if found.up_to_date else sys.stderr)
        return 0 if found.up_to_date else 1
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"-o {directory}: exists and is not a directory")
    clashes = [d.path for d in check(directory, files, patterns).differences
               if d.text == NOT_OURS]
    if clashes:
        raise UsageError(f"-o {directory}: " + ", ".join(clashes) + " would be overwritten but "
                         "was not written by dbspec (no generated header); move it away or "
                         "choose another -o directory")
    try:
        changed = write(directory, files, patterns)
    except OSError as exc:
        raise UsageError(f"cannot write to {directory}: {exc.strerror or exc}") from None
    for relative in changed:
        print(f"wrote {directory / relative}" if not relative.endswith("(removed)")
              else f"removed {directory / relative.removesuffix(' (removed)')}")
    if not changed:
        print(f"{directory}: {len(files)} generated file(s) already up to date")
    deploy = [f"bash {directory / name}" for name in sorted(files) if name.startswith("deploy")] \
        or [f"cd {directory} && databricks bundle deploy" + (f" --target {t}" if t else "")
            for t in args.targets or [None]]
    print("deploy: " + "; ".join(deploy))
    return 0

"""The sections of ``benchmarks/RESULTS.md`` that benchmark scripts write with ``--results``.

Each script owns the text between ``<!-- begin: written by NAME --results -->`` and
``<!-- end: NAME -->``; a rerun replaces it, and ``tests/test_benchmark_results.py`` holds each
goal in the figures last written there, so a change that loses a goal shows when the script is
rerun. The conditions line says when, on how many cores and at what load the figures were
taken: on a busy machine they are slower, and the line says so.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def markers(script: str) -> tuple[str, str]:
    """The begin and end markers of ``script``'s section."""
    return f"<!-- begin: written by {script} --results -->", f"<!-- end: {script} -->"


def load() -> str:
    """The 1-, 5- and 15-minute load averages, as the conditions line gives them."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def conditions(command: str, start_load: str) -> str:
    """``**Conditions.** <UTC time>, load average <start> at the start, <now> at the end,
    <n> cores. `<command>`.``"""
    return (f"**Conditions.** {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load "
            f"average {start_load} at the start, {load()} at the end, {os.cpu_count()} cores. "
            f"`{command}`.")


def write_section(script: str, lines: list[str]) -> None:
    """Replace ``script``'s section of RESULTS.md with ``lines`` (appended at the end the first
    time) and say where it went."""
    begin, end = markers(script)
    text = "\n".join([begin, *lines, end])
    current = RESULTS.read_text()
    if begin in current and end in current:
        head, rest = current.split(begin, 1)
        current = head + text + rest.split(end, 1)[1]
    else:
        current = current.rstrip("\n") + "\n\n" + text + "\n"
    RESULTS.write_text(current)
    print(f"wrote {script}'s section of {RESULTS}")

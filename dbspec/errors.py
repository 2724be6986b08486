"""The one exception family of dbspec and the located diagnostics it carries.

Every user mistake ends as a :class:`DbspecError` subclass; the CLI prints it without a traceback
and exits with the error's ``exit_code``. Anything else reaching the CLI is a bug in dbspec.
"""

from __future__ import annotations

import difflib
from typing import Iterable, Literal, NamedTuple

Severity = Literal["error", "warning"]


class Diagnostic(NamedTuple):
    """One finding about a spec, located like a compiler message.

    Attributes:
        file: The spec file the finding is about.
        line: 1-based line, or 0 when the value came from the command line.
        column: 1-based column, or 0 with ``line``.
        path: Dotted path of the spec field (``training.optimizer.name``); empty for the document.
        message: What was found, what was expected and, where it helps, what to do.
        severity: ``error`` makes the spec invalid; ``warning`` does not.
        origin: Where the value came from when not the file itself (``--set a.b=1``).
    """

    file: str
    line: int
    column: int
    path: str
    message: str
    severity: Severity = "error"
    origin: str = ""

    def format(self) -> str:
        """Render as ``file:line:col: path: message`` (warnings say so)."""
        where = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        head = "warning: " if self.severity == "warning" else ""
        path = f"{self.path}: " if self.path else ""
        origin = f" [from {self.origin}]" if self.origin else ""
        return f"{where}: {head}{path}{self.message}{origin}"

    def to_dict(self) -> dict:
        """A JSON-ready mapping with the documented keys."""
        return self._asdict()


class DbspecError(Exception):
    """Root of every error dbspec reports to a user."""

    exit_code = 1


class UsageError(DbspecError):
    """The command line is wrong or a file cannot be read (exit code 2)."""

    exit_code = 2


class SpecError(DbspecError):
    """A spec is invalid; carries every diagnostic found in one pass."""

    exit_code = 1

    def __init__(self, diagnostics: Iterable[Diagnostic]):
        self.diagnostics = tuple(diagnostics)
        errors = [d for d in self.diagnostics if d.severity == "error"]
        super().__init__("\n".join(d.format() for d in errors or self.diagnostics))


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """Return `` (did you mean 'x'?)`` for the closest candidate, or an empty string."""
    match = difflib.get_close_matches(str(word), list(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def one_of(candidates: Iterable[str]) -> str:
    """Quote a closed set of choices for a message: ``'a', 'b' or 'c'``."""
    items = [f"'{c}'" for c in candidates]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]

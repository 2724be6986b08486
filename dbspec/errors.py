"""The one exception family of dbspec and the located diagnostics it carries.

Every user mistake ends as a :class:`DbspecError` subclass; the CLI prints it without a traceback
and exits with the error's ``exit_code``. Anything else reaching the CLI is a bug in dbspec.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Literal, NamedTuple

Severity = Literal["error", "warning"]

#: Values shorter than this are not masked inside text: "1" or "cpu" are no secrets, and
#: masking them would garble every message that happens to contain them.
MIN_SECRET_LENGTH = 4
_secrets: dict[str, str] = {}  # value -> what is shown instead ({{ env.NAME }})
_secrets_lock = threading.Lock()
_pattern: list = [None]  # compiled alternation of the values, longest first; None: rebuild


def register_secret(value: Any, shown_as: str) -> None:
    """Remember a value read from the environment, so that :func:`redact` shows ``shown_as``
    instead (in diagnostics, MLflow params, logged specs); per process, and only grows."""
    if not isinstance(value, str) or len(value) < MIN_SECRET_LENGTH:
        return
    with _secrets_lock:
        for variant in {value, repr(value)[1:-1], value.encode("unicode_escape").decode()}:
            if len(variant) >= MIN_SECRET_LENGTH and variant not in _secrets:
                _secrets[variant] = shown_as
                _pattern[0] = None


def redact(text: Any) -> Any:
    """``text`` with every registered environment value replaced by how it was written."""
    if not isinstance(text, str) or not _secrets:
        return text
    pattern = _pattern[0]
    if pattern is None:
        import re

        with _secrets_lock:
            ordered = sorted(_secrets, key=len, reverse=True)
            pattern = _pattern[0] = re.compile("|".join(map(re.escape, ordered)))
    text = pattern.sub(lambda m: _secrets[m.group(0)], text)
    return _redact_truncated(text) if "..." in text or "\u2026" in text else text


#: A shortened value (``'ghp_A1b2...'``, ``...A1b2'``) is masked when this much of it shows.
_MIN_TRUNCATED = 8
#: Messages show at most this much of a shortened value; longer runs are not looked for.
_MAX_TRUNCATED = 256


def _redact_truncated(text: str) -> str:
    """Mask the start of a secret before ``...`` and the end of one after it: messages shorten
    long values, and a shortened secret is still a secret."""
    import re

    with _secrets_lock:
        secrets = [(v, shown) for v, shown in _secrets.items() if len(v) > _MIN_TRUNCATED]
    out, last = [], 0
    for mark in re.finditer(r"\.\.\.|\u2026", text):
        start, end = mark.start(), mark.end()
        cut_before, shown_before = _longest_part(text[max(last, start - _MAX_TRUNCATED):start],
                                                 secrets, at_end=True)
        cut_after, shown_after = _longest_part(text[end:end + _MAX_TRUNCATED], secrets,
                                               at_end=False)
        if cut_before or cut_after:
            out.append(text[last:start - cut_before])
            out.append(shown_after if cut_after else shown_before)
            last = end + cut_after
    out.append(text[last:])
    return "".join(out)


def _longest_part(text: str, secrets: list[tuple[str, str]], *, at_end: bool) -> tuple[int, str]:
    """(length, shown as) of the longest start of a secret ending ``text`` (``at_end``), or
    end of one starting it; at least :data:`_MIN_TRUNCATED` long, else (0, "")."""
    best, shown_as = 0, ""
    for value, shown in secrets:
        for k in range(min(len(value) - 1, len(text)), max(best, _MIN_TRUNCATED - 1), -1):
            if (text[-k:] == value[:k]) if at_end else (text[:k] == value[-k:]):
                best, shown_as = k, shown
                break
    return best, shown_as


def redact_data(value: Any) -> Any:
    """:func:`redact` through dicts (keys and values), lists and tuples."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_data(k): redact_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_data(v) for v in value)
    return value


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

    def redacted(self) -> "Diagnostic":
        """This diagnostic with environment values masked; every output format starts here."""
        return self._replace(file=redact(self.file), path=redact(self.path),
                             message=redact(self.message), origin=redact(self.origin))

    def format(self) -> str:
        """Render as ``file:line:col: path: message`` (warnings say so; secrets masked)."""
        self = self.redacted()
        where = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        head = "warning: " if self.severity == "warning" else ""
        path = f"{self.path}: " if self.path else ""
        origin = f" [from {self.origin}]" if self.origin else ""
        return f"{where}: {head}{path}{self.message}{origin}"

    def to_dict(self) -> dict:
        """A JSON-ready mapping with the documented keys (secrets masked)."""
        return self.redacted()._asdict()


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
    import difflib  # only a spec with a mistake needs it: not on the path of a valid one

    candidates = list(candidates)
    folded = [c for c in candidates if str(c).casefold() == str(word).casefold()]  # 'Y' for 'y'
    match = folded or difflib.get_close_matches(str(word), candidates, n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def one_of(candidates: Iterable[str]) -> str:
    """Quote a closed set of choices for a message: ``'a', 'b' or 'c'``."""
    items = [f"'{c}'" for c in candidates]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]

"""Names that become path parts (:data:`NAME_PATTERN`: no separator, ``..``, leading dot or
dash), and :func:`inside`, the check every writer makes before creating a path from parts.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Union

from dbspec.errors import DbspecError, UsageError

#: A name used as a path part: letters, digits, ``_``, ``-`` and ``.``, starting with a letter
#: or digit (so never ``..``, ``.hidden`` or an option like ``-x``), at most 128 characters.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"
#: Target names are also parts of endpoint and job names: no dots.
TARGET_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$"
NAME_RULE = ("letters, digits, '_', '-' and '.', starting with a letter or digit, at most 128 "
             "characters")
TARGET_RULE = "letters, digits, '_' and '-', starting with a letter or digit, at most 64 characters"


class PathEscape(DbspecError):
    """A path built from names would lie outside the directory it belongs in."""


def is_name(value: str, pattern: str = NAME_PATTERN) -> bool:
    """Whether ``value`` may be used as one path part."""
    return isinstance(value, str) and re.fullmatch(pattern, value) is not None


def check_name(value: str, what: str, *, pattern: str = NAME_PATTERN,
               rule: str = NAME_RULE) -> str:
    """``value``, if it is a safe name; else a :class:`UsageError` naming ``what`` (``--run-key``).

    Raises:
        UsageError: ``value`` could escape a directory or be taken for an option.
    """
    if not is_name(value, pattern):
        raise UsageError(f"{what} {value!r}: not a valid name; use {rule}")
    return value


def inside(root: Union[str, os.PathLike], *parts: Union[str, os.PathLike]) -> Path:
    """``root / parts`` (not resolved: messages stay readable), checked on the resolved paths
    to stay inside ``root``: no absolute part, climbing ``..`` or symlink leading out.

    Raises:
        PathEscape: the path would lie outside ``root``.
    """
    base = Path(root)
    path = base.joinpath(*parts)
    real_root = base.resolve()
    real = path.resolve()
    if real != real_root and real_root not in real.parents:
        shown = "/".join(str(p) for p in parts)
        raise PathEscape(f"{shown!r} would be written outside {base} (to {real}); names used "
                         f"in paths may contain only {NAME_RULE}")
    return path


__all__ = ["NAME_PATTERN", "TARGET_PATTERN", "PathEscape", "check_name", "inside", "is_name"]


def writable_directory(path: Union[str, Path], what: str) -> Path:
    """``path`` as a directory this process can write into, created when missing.

    Raises:
        DbspecError: ``what`` (``--state-dir``) names a path that cannot be created or written.
    """
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise DbspecError(f"{what} {directory}: exists and is not a directory") from None
    except OSError as exc:
        raise DbspecError(f"{what} {directory}: cannot create it: {exc.strerror or exc}") \
            from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise DbspecError(f"{what} {directory}: not writable by this user")
    return directory

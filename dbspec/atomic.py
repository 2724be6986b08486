"""All-or-nothing writes of one file (:func:`atomic_file`) or a whole directory
(:func:`replace_directory`); every write dbspec wants whole goes through here.

A file is written under a hidden name beside it (``.<name>.<pid>-<random>.partial``), flushed and
renamed over the target: a reader or a crash sees the old file or the new one, never half.
A directory (Spark writes part files) is staged beside the target
(``.<name>.staging-<pid>-<random>``) and swapped in with ``renameat2(RENAME_EXCHANGE)`` where the
file system supports it; elsewhere the old one is renamed aside (``.<name>.old-...``) first, and
a kill between the two renames leaves it there for :func:`remove_leftovers` (run by the next
write) to put back. That function also deletes staging directories of dead processes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator, Union

from dbspec.processes import process_alive

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@contextmanager
def atomic_file(path: Union[str, Path], *, text: bool = False,
                durable: bool = True) -> Iterator[IO[Any]]:
    """A handle whose content replaces ``path`` whole when the block ends without an error.

    Args:
        text: A text handle (UTF-8) instead of a binary one.
        durable: fsync before the rename, so a power loss keeps the old file or the new one;
            off for files that are cheap to write again.
    """
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial")
    try:
        with open(partial, "w" if text else "wb", encoding="utf-8" if text else None) as handle:
            yield handle
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def write_atomic(path: Union[str, Path], data: Union[bytes, str], *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` whole (see :func:`atomic_file`)."""
    with atomic_file(path, text=isinstance(data, str), durable=durable) as handle:
        handle.write(data)


def staging_for(target: Path) -> Path:
    """A new hidden staging path beside ``target``, named after this process."""
    return target.parent / f".{target.name}.staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def replace_directory(staging: Path, target: Path) -> None:
    """Put ``staging`` at ``target`` in one step where the system allows (see the module)."""
    if not os.path.lexists(target):
        os.rename(staging, target)
        return
    if _exchange(staging, target):
        shutil.rmtree(staging, ignore_errors=True)  # the old contents, under the staging name
        return
    aside = target.parent / f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.rename(target, aside)
    os.rename(staging, target)
    shutil.rmtree(aside, ignore_errors=True)


def remove_leftovers(target: Path) -> list[Path]:
    """Clean up after killed writes to ``target``; returns what was removed or restored.

    Staging directories of dead processes are deleted. An old directory set aside by a write
    that died between its two renames is put back when the target is missing, else deleted.
    """
    handled: list[Path] = []
    if not target.parent.is_dir():
        return handled
    for kind in ("staging", "old"):
        for path in _left_by_dead(target, f"{kind}-*", f".{target.name}.{kind}-"):
            if kind == "old" and not os.path.lexists(target):
                os.rename(path, target)
            else:
                shutil.rmtree(path, ignore_errors=True)
            handled.append(path)
    return handled


def remove_partial_files(target: Path) -> list[Path]:
    """Delete the temporary files killed :func:`atomic_file` writes of ``target`` left (those
    of live processes stay: they are still writing); returns what was deleted."""
    removed = _left_by_dead(target, "*.partial", f".{target.name}.")
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def _left_by_dead(target: Path, pattern: str, prefix: str) -> list[Path]:
    """Paths ``.<target name>.<pattern>`` beside ``target`` whose PID (after ``prefix``) is no
    live process's."""
    dead = []
    for path in sorted(target.parent.glob(f".{target.name}.{pattern}")):
        pid = path.name[len(prefix):].split("-", 1)[0]
        if not (pid.isdigit() and is_alive(int(pid))):
            dead.append(path)
    return dead


def is_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process other than this one (an earlier, interrupted call of
    this process left what it left for good)."""
    return pid != os.getpid() and process_alive(pid)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically; False where the system or file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(b))

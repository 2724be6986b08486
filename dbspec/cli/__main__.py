"""``python -m dbspec.cli`` (the same as ``python -m dbspec``)."""

from dbspec.cli import entry_point

entry_point()

"""The ``dbspec`` command line: one module per command group (``*_commands``, each a
``COMMANDS`` tuple); :mod:`~dbspec.cli.parser` assembles them and :mod:`~dbspec.cli.main` runs
one, turning errors into messages and exit codes. Handlers import what they need when they run.
"""

from dbspec.cli.main import entry_point, main, missing_extra
from dbspec.cli.parser import build_parser
from dbspec.cli.run_commands import EXIT_REJECTED

__all__ = ["EXIT_REJECTED", "build_parser", "entry_point", "main", "missing_extra"]

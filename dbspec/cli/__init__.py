"""The ``dbspec`` command line, one module per command group.

- :mod:`~dbspec.cli.spec_commands`: validate, plan, init, diff, schema (light: no torch,
  mlflow, pyspark, optuna or deepspeed, so a pull-request check is fast);
- :mod:`~dbspec.cli.run_commands`: run, gc, tensorboard;
- :mod:`~dbspec.cli.registry_commands`: models, promote, approve, rollback;
- :mod:`~dbspec.cli.serving_commands`: serve, predict, endpoint, jobs;
- :mod:`~dbspec.cli.parser` assembles them; :mod:`~dbspec.cli.main` runs one and turns
  errors into messages and exit codes.

Each handler imports what it needs when it runs.
"""

from dbspec.cli.main import entry_point, main, missing_extra
from dbspec.cli.parser import build_parser
from dbspec.cli.run_commands import EXIT_REJECTED

__all__ = ["EXIT_REJECTED", "build_parser", "entry_point", "main", "missing_extra"]

"""Run a command: parse, dispatch to its handler, and turn errors into messages and exit codes.

User mistakes (:class:`~dbspec.errors.DbspecError`) print one located line, never a
traceback; a missing optional dependency names the extra to install.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Callable, Optional, Sequence

from dbspec.cli.parser import parse_arguments
from dbspec.errors import DbspecError, SpecError, redact

#: Commands that read specs and start no training, serving or Spark.
LIGHT_COMMANDS = ("validate", "plan", "schema", "diff", "jobs", "init", "gc")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 invalid spec or failed run, 2 usage)."""
    args = parse_arguments(sys.argv[1:] if argv is None else list(argv))
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        _check_names(args)
    except DbspecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    _set_environment(args)
    try:
        with contextlib.redirect_stdout(_Redacting(sys.stdout)), \
                contextlib.redirect_stderr(_Redacting(sys.stderr)):
            return handler(args)
    except SpecError as exc:
        for diag in exc.diagnostics:
            print(diag.format(), file=sys.stderr)
        return exc.exit_code
    except DbspecError as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except ImportError as exc:  # ModuleNotFoundError, importlib.metadata's PackageNotFoundError
        needed = missing_extra(exc)
        if needed is None:
            raise
        print(f"error: dbspec {args.command} needs {needed}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def _set_environment(args: argparse.Namespace) -> None:
    """What the options say to code that reads the environment."""
    if getattr(args, "verbose", False):
        os.environ["DBSPEC_VERBOSE"] = "1"  # read where Spark starts (dbspec.spark)
    if args.command in LIGHT_COMMANDS:
        # Spec models need no third-party pydantic plugins; looking them up scans every
        # installed package's entry points, a large part of a cold `validate`.
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")


#: Which extra brings each third-party module (or distribution) a command may import; the
#: compute kinds add their own (see ``_kind_extras``).
_EXTRAS = {
    **dict.fromkeys(("torch", "mlflow", "optuna", "cmaes", "sklearn", "scikit-learn", "numpy",
                     "pandas", "pyarrow", "deltalake", "psutil", "pynvml", "nvidia-ml-py",
                     "matplotlib", "tensorboard", "scipy", "sqlalchemy"), "train"),
    "pyspark": "spark", "py4j": "spark",
    **dict.fromkeys(("uvicorn", "httptools", "uvloop", "orjson", "httpx"), "serve"),
    **dict.fromkeys(("transformers", "peft", "safetensors", "accelerate"), "finetune"),
}


def missing_extra(exc: ImportError) -> Optional[str]:
    """What to install for a missing third-party package, or None when ``exc`` is about
    something else (a module of dbspec itself is a bug, not a missing extra)."""
    from importlib.metadata import PackageNotFoundError

    if isinstance(exc, PackageNotFoundError):
        name = str(exc.args[0]) if exc.args else ""
    elif isinstance(exc, ModuleNotFoundError) and exc.name:
        name = exc.name
    else:
        return None
    extra = _EXTRAS.get(name.split(".")[0]) or _kind_extras().get(name.split(".")[0])
    if extra is None:
        return None
    return (f"the '{extra}' extra ({name} is not installed): "
            f"pip install 'dbspec[{extra}]' (or 'dbspec[all]')")


def _kind_extras() -> dict[str, str]:
    """The extras the compute kinds name for what they import (DeepSpeed, Ray...)."""
    from dbspec.seams.compute import COMPUTE

    return {module: extra for kind in COMPUTE.load_all().values()
            for module, extra in kind.extras.items()}


class _Redacting:
    """A text stream that masks values read from the environment (:func:`redact`) in what a
    command prints: plans, diffs and summaries show ``{{ env.NAME }}``, never the value."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _check_names(args: argparse.Namespace) -> None:
    """Names from the command line that become path parts (--target, --run-key) are names."""
    from dbspec.paths import TARGET_PATTERN, TARGET_RULE, check_name

    for target in [getattr(args, "target", None), *getattr(args, "targets", [])]:
        if target is not None:
            check_name(target, "--target", pattern=TARGET_PATTERN, rule=TARGET_RULE)
    key = getattr(args, "run_key", None)
    if key is not None and key.strip():  # an empty key has its own message
        check_name(key, "--run-key")


def entry_point() -> None:
    """Console-script entry: exit with :func:`main`'s code."""
    sys.exit(main())

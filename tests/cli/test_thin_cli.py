"""A thin command line: argparse lives only in ``dbspec/cli``, and each command's handler parses,
calls one use case of the domain and prints what it returns.

"One use case" is checked on the handler's own body: of the dbspec functions it calls that live
outside ``dbspec.cli``, at most one is not a renderer (a function that only turns a result
into text: ``render_*``, ``report_*``, ``describe_*``, ``*_line``, ``*_text``). Records and
exceptions (classes) are not calls of the domain. Handlers that did more when the rule began
(issue 30) are listed with their count; the count may fall, never rise, and nothing may join.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from pathlib import Path

import pytest

from dbspec.cli.parser import COMMANDS
from tests.conftest import run_main

PACKAGE = Path(__file__).resolve().parents[2] / "dbspec"
#: Most statements of a handler's own body (imports and docstring aside).
MAX_HANDLER_STATEMENTS = 12
#: Handlers calling more than one use case when the rule began: command -> use cases then.
WIDE_HANDLERS = {"init": 3, "diff": 3, "tensorboard": 4, "promote": 2, "approve": 2}
#: Each serving and monitoring command and the one use case it calls.
USE_CASES = {"serve": "dbspec.serving.use_cases.serve_model",
             "predict": "dbspec.serving.use_cases.predict_table",
             "endpoint": "dbspec.serving.use_cases.update_endpoint",
             "monitor": "dbspec.monitoring.use_case.monitor_served",
             "jobs": "dbspec.jobs.command.run_jobs"}
_RENDERERS = ("render", "report", "describe")


def _imports_argparse(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "argparse"
                                                for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "argparse":
            return True
    return False


def test_argparse_is_imported_only_under_dbspec_cli():
    outside = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if "cli" not in p.relative_to(PACKAGE).parts[:1]
                     and _imports_argparse(ast.parse(p.read_text(encoding="utf-8"))))
    assert outside == []
    inside = [p for p in (PACKAGE / "cli").rglob("*.py")
              if _imports_argparse(ast.parse(p.read_text(encoding="utf-8")))]
    assert inside  # the scan finds what it looks for


def test_the_scan_sees_every_way_of_importing_argparse():
    for text in ("import argparse", "from argparse import Namespace",
                 "def f():\n    import argparse as a", "import argparse.x"):
        assert _imports_argparse(ast.parse(text)), text
    assert not _imports_argparse(ast.parse("import argparse_extras\n'argparse'"))


class _Handler:
    """A command's handler: its own body, and the dbspec functions outside the CLI it calls."""

    def __init__(self, command):
        self.function = command.handler
        tree = ast.parse(textwrap.dedent(inspect.getsource(command.handler)))
        self.node = tree.body[0]
        assert isinstance(self.node, ast.FunctionDef)

    def statements(self) -> int:
        return sum(1 for s in self.node.body
                   if not isinstance(s, (ast.Import, ast.ImportFrom))
                   and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)))

    def domain_calls(self) -> set[str]:
        """Qualified names of the functions outside dbspec.cli that the body calls."""
        imported = {}
        for node in ast.walk(self.node):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dbspec") \
                    and not (node.module or "").startswith("dbspec.cli"):
                for alias in node.names:
                    imported[alias.asname or alias.name] = (node.module, alias.name)
        for name, value in vars(inspect.getmodule(self.function)).items():
            module = getattr(value, "__module__", "") or ""
            if callable(value) and module.startswith("dbspec") and \
                    not module.startswith("dbspec.cli"):
                imported.setdefault(name, (module, getattr(value, "__name__", name)))
        called = set()
        for node in ast.walk(self.node):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in imported:
                module, name = imported[node.func.id]
                value = getattr(importlib.import_module(module), name)
                if not inspect.isclass(value) and not _is_renderer(name):
                    called.add(f"{value.__module__}.{value.__name__}")
        return called


def _is_renderer(name: str) -> bool:
    return name.startswith(_RENDERERS) or name.endswith(("_line", "_text"))


HANDLERS = {command.name: _Handler(command) for command in COMMANDS}


@pytest.mark.parametrize("name", sorted(HANDLERS))
def test_each_handler_parses_calls_one_use_case_and_prints(name):
    handler = HANDLERS[name]
    assert handler.statements() <= MAX_HANDLER_STATEMENTS, \
        f"dbspec {name}: {handler.statements()} statements; move the work into a use case"
    calls = handler.domain_calls()
    allowed = WIDE_HANDLERS.get(name, 1)
    assert len(calls) <= allowed, f"dbspec {name} calls {sorted(calls)}: one use case only"
    if name in WIDE_HANDLERS:
        assert len(calls) > 1, f"dbspec {name} is thin now: delete it from WIDE_HANDLERS"


def test_the_wide_list_names_only_commands_that_exist():
    assert set(WIDE_HANDLERS) <= set(HANDLERS)


@pytest.mark.parametrize("name, use_case", sorted(USE_CASES.items()))
def test_serving_and_monitoring_commands_call_their_use_case(name, use_case):
    assert HANDLERS[name].domain_calls() == {use_case}


def test_an_unknown_engine_is_refused_before_the_registry_is_asked(tmp_path):
    code, _, err = run_main("predict", "models:/nowhere/1", "--input", "in.parquet",
                            "--output", str(tmp_path / "out"), "--engine", "sprk",
                            "--tracking-uri", "http://127.0.0.1:9")
    assert code == 2, err
    assert "no batch serving target runs on 'sprk' (did you mean 'spark'?)" in err
    assert "Traceback" not in err


def _fat_handler(args) -> int:
    from dbspec.serving.source import open_client, resolve_version, spec_target

    client = open_client(args.tracking_uri, args.state_dir)
    print(resolve_version(client, spec_target(args.spec)))
    return 0


def test_the_check_counts_each_use_case_a_handler_calls():
    from dbspec.cli.options import Command

    fat = _Handler(Command("fat", "", lambda parser: None, _fat_handler, ""))
    assert fat.domain_calls() == {"dbspec.serving.source.open_client",
                                  "dbspec.serving.source.resolve_version",
                                  "dbspec.serving.source.spec_target"}
    assert fat.statements() == 3

"""The command line as a user meets it: exit codes, formats, no tracebacks, light imports.

A real ``python -m dbspec`` process for an exit 0, an exit 1 and ``--version`` (and the import
checks); the other commands, whose output and exit code are what is checked, run the CLI's
``main`` in this process (seconds less each).
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.conftest import ASSETS, MINIMAL, ROOT, SPECS, run_cli, run_in_process

INVALID = sorted(str(p) for p in (ASSETS / "invalid").glob("*.yaml"))
HEAVY = ("torch", "mlflow", "pyspark", "optuna", "deepspeed", "sklearn", "pandas", "onnx",
         "onnxruntime", "onnxscript", "transformers", "peft", "safetensors", "tokenizers")


def test_validate_all_examples_exits_0():
    result = run_cli("validate", *map(str, SPECS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(SPECS)} files checked: all valid" in result.stdout


def test_every_broken_spec_exits_1_without_a_traceback():
    result = run_cli("validate", *INVALID, env={"DBSPEC_TEST_SURELY_UNSET": ""})
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert f"{len(INVALID)} files checked: {len(INVALID)} invalid" in result.stdout


@pytest.mark.parametrize("args, code, message", [
    (["validate", "no/such/spec.yaml"], 2, "no/such/spec.yaml: no such file"),
    (["validate", "specs"], 2, "is a directory"),
    (["validate", "specs/diabetes.yaml", "--target", "prd"], 2, "unknown target 'prd'"),
    (["validate", "specs/diabetes.yaml", "--set", "epochs"], 2, "expected dotted.path=value"),
    (["plan", "specs/diabetes.yaml", "--set", "name.x=1"], 2, "its parent holds the value"),
    (["plan", "no/such.yaml"], 2, "error: no/such.yaml: no such file"),
    (["validate"], 2, "the following arguments are required: SPEC"),
    (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
])
def test_usage_errors_exit_2(args, code, message):
    result = run_in_process(*args)
    assert result.returncode == code
    assert message in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_unreadable_file_among_valid_ones_still_checks_the_rest():
    result = run_in_process("validate", "specs/diabetes.yaml", "missing.yaml")
    assert result.returncode == 2
    assert "specs/diabetes.yaml: ok" in result.stdout
    assert "missing.yaml: no such file" in result.stdout


def test_json_format(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL.replace("task: regression", "task: regresion"))
    result = run_in_process("validate", "--format", "json", str(bad), "specs/diabetes.yaml")
    assert result.returncode == 1
    (item,) = json.loads(result.stdout)
    assert set(item) == {"file", "line", "column", "path", "message", "severity", "origin"}
    assert (item["line"], item["column"], item["path"]) == (2, 55, "data.task")
    assert item["severity"] == "error"
    assert "1 invalid" in result.stderr  # the summary stays off stdout


def test_github_format(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL + "training: {lerning_rate: 0.1}\n")
    result = run_in_process("validate", "--format", "github", str(bad))
    (line,) = result.stdout.splitlines()
    assert line.startswith(f"::error file={bad},line=8,col=12,title=training.lerning_rate::")
    assert "unknown key 'lerning_rate'" in line


def test_github_format_escapes_properties():
    from dbspec.spec.report import github_annotation as _github_annotation
    from dbspec.errors import Diagnostic

    line = _github_annotation(Diagnostic("a,b:c.yaml", 1, 2, "x", "50% bad\nnext", "warning"))
    assert line == "::warning file=a%2Cb%3Ac.yaml,line=1,col=2,title=x::50%25 bad%0Anext"


def test_warnings_pass_unless_strict():
    ok = run_in_process("validate", "specs/synthetic_deepspeed.yaml")
    assert ok.returncode == 0 and "warning: compute.kind" in ok.stdout
    strict = run_in_process("validate", "--strict", "specs/synthetic_deepspeed.yaml")
    assert strict.returncode == 1


def test_target_and_set_on_validate():
    result = run_in_process("validate", "specs/diabetes.yaml", "--target", "prod",
                            "--set", "training.epochs=0")
    assert result.returncode == 1
    assert "training.epochs: must be greater than or equal to 1, got 0 " \
           "[from --set training.epochs=0]" in result.stdout


def test_plan_formats():
    text = run_in_process("plan", "specs/diabetes.yaml")
    assert text.returncode == 0 and text.stdout.startswith("plan for diabetes-regressor")
    data = json.loads(run_in_process("plan", "specs/diabetes.yaml", "--format", "json").stdout)
    assert [s["name"] for s in data["stages"]][-2:] == ["promote", "serve"]
    mermaid = run_in_process("plan", "specs/diabetes.yaml", "--format", "mermaid").stdout
    assert mermaid.startswith("flowchart TD")


def test_plan_of_an_invalid_spec_exits_1():
    result = run_in_process("plan", INVALID[0], env={"DBSPEC_TEST_SURELY_UNSET": ""})
    assert result.returncode == 1 and result.stdout == ""
    assert "Traceback" not in result.stderr and result.stderr


def test_schema_command_writes_the_committed_schema(tmp_path):
    target = tmp_path / "out" / "schema.json"
    result = run_in_process("schema", "-o", str(target))
    assert result.returncode == 0
    assert target.read_text() == (ROOT / "schemas" / "dbspec.schema.json").read_text()
    assert run_in_process("schema").stdout == target.read_text()


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.startswith("dbspec ")


def test_help_lists_every_command():
    from dbspec.cli.parser import COMMANDS

    result = run_in_process("--help")
    assert result.returncode == 0
    commands = result.stdout.split("  COMMAND\n", 1)[1].split("\n\n", 1)[0]
    listed = [line.split()[0] for line in commands.splitlines() if line[4:5].strip()]
    assert listed == [c.name for c in COMMANDS]


def _help(parser, command: str, capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        parser.parse_args([command, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def _command_names() -> list[str]:
    from dbspec.cli.parser import COMMANDS

    return [c.name for c in COMMANDS]


@pytest.mark.parametrize("command", _command_names())
def test_a_command_built_alone_parses_as_with_all_the_others(command, capsys):
    """``main`` builds only the invoked command's arguments: the same as the full parser's."""
    from dbspec.cli.parser import build_parser

    alone = _help(build_parser(only=command), command, capsys)
    assert alone == _help(build_parser(), command, capsys)
    assert f"usage: dbspec {command} [-h] " in alone and "options:" in alone


PROBE = """
import sys, contextlib, io
from dbspec.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
heavy = [m for m in {heavy!r} if m in sys.modules]
print(code, ",".join(heavy))
"""


@pytest.mark.parametrize("args", [
    ["validate", *map(str, SPECS)],
    ["plan", "specs/breast_cancer_search.yaml"],
    ["plan", "specs/breast_cancer_search.yaml", "--state-dir", "tests"],  # with statuses
    ["schema"],
    ["jobs", "specs/synthetic_deepspeed.yaml", "--check", "-o", "tests"],
    ["diff", "specs/diabetes.yaml", "specs/diabetes_batch.yaml"],
])
def test_light_commands_import_no_heavy_library(args):
    import subprocess

    for name in ("torch", "mlflow", "optuna"):
        pytest.importorskip(name)  # the check only means something where they are installed
    result = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    code, heavy = result.stdout.split()[0], result.stdout.split()[1:]
    assert code == ("1" if "--check" in args else "0"), result.stderr
    assert heavy == [], f"{args[0]} imported {heavy}"


def test_validate_reads_a_local_csv_header_without_a_heavy_library(tmp_path):
    import subprocess

    (tmp_path / "rows.csv").write_text("age,bmi,progression\n50,22.5,151\n")
    (tmp_path / "spec.yaml").write_text(MINIMAL.replace(
        "{source: {kind: sklearn, name: diabetes}, task: regression}",
        "{source: {kind: csv, path: rows.csv}, target: progresion, task: regression}"))
    probe = PROBE.replace("io.StringIO()", "sys.stderr")  # its findings where the test sees them
    result = subprocess.run([sys.executable, "-c", probe.format(heavy=HEAVY), "validate",
                             "spec.yaml"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.stdout.split() == ["1"], result.stderr  # invalid, and nothing heavy imported
    assert "spec.yaml:2:53: data.target: no column 'progresion' in rows.csv (did you mean " \
        "'progression'?); its header has: age, bmi, progression" in result.stderr


@pytest.mark.parametrize("target, message", [
    ("specs", "cannot write specs: Is a directory"),
    ("README.md/x.json", "cannot write README.md/x.json"),
])
def test_schema_to_a_bad_path_is_a_usage_error(target, message):
    result = run_in_process("schema", "-o", target)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr


def test_plan_shows_a_status_column_against_a_state_dir(tmp_path):
    (tmp_path / "state").mkdir()
    result = run_in_process("plan", "specs/diabetes.yaml", "--state-dir", str(tmp_path / "state"))
    assert result.returncode == 0 and " status " in result.stdout.splitlines()[1]
    assert result.stdout.count(" new ") == 8


def test_plan_with_a_missing_state_dir_exits_2(tmp_path):
    result = run_in_process("plan", "specs/diabetes.yaml", "--state-dir", str(tmp_path / "x"))
    assert result.returncode == 2 and "no such directory" in result.stderr


def test_gc_usage_errors_exit_2(tmp_path):
    result = run_in_process("gc", "--state-dir", str(tmp_path), "--keep", "0")
    assert result.returncode == 2 and "keep at least 1" in result.stderr
    result = run_in_process("gc", "--state-dir", str(tmp_path))
    assert result.returncode == 2 and "no runs here" in result.stderr

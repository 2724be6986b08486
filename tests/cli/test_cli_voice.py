"""One CLI voice: one JSON flag, one meaning and one metavar per name, a description for every
command, a subcommand's own usage for its errors, and flags its own messages name."""

from __future__ import annotations

import pytest

from dbspec.cli.parser import COMMANDS
from tests.conftest import ROOT, run_cli, run_in_process

NAMES = [command.name for command in COMMANDS]


@pytest.mark.parametrize("name", NAMES)
def test_every_command_has_a_description_and_names_a_spec_argument_spec(name):
    shown = run_in_process(name, "--help")
    assert shown.returncode == 0, shown.stderr
    usage, _, rest = shown.stdout.partition("\n\n")
    description = rest.split("\n\n")[0]
    assert not description.startswith(("positional arguments", "options")), shown.stdout
    assert " FILE" not in usage  # a spec is SPEC in every command
    json_flags = {"--json", "--summary-json"} & set(shown.stdout.replace("[", " ").split())
    assert json_flags <= {"--summary-json"}, json_flags  # JSON output is --format json


def test_monitor_takes_format_json_and_still_json_with_a_warning(tmp_path):
    assert "--format {text,json}" in run_in_process("monitor", "--help").stdout
    old = run_in_process("monitor", "none.yaml", "--json", cwd=tmp_path)
    assert "warning: --json is deprecated; use --format json" in old.stderr
    new = run_in_process("monitor", "none.yaml", "--format", "json", cwd=tmp_path)
    assert "deprecated" not in new.stderr
    assert old.returncode == new.returncode == 2 and "none.yaml: no such file" in new.stderr


def test_an_unknown_flag_is_shown_with_the_subcommand_usage():
    result = run_cli("validate", str(ROOT / "specs" / "diabetes.yaml"), "--bogus")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: dbspec validate ")
    assert "dbspec validate: error: unrecognized arguments: --bogus" in result.stderr


def test_run_takes_the_tracking_uri_its_error_names(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text((ROOT / "specs" / "diabetes.yaml").read_text())
    result = run_in_process("run", str(spec), "--smoke", "-q", "--tracking-uri",
                            "http://127.0.0.1:9", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": ""})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the MLflow tracking server at http://127.0.0.1:9 does not answer" in result.stderr
    assert "--tracking-uri" in result.stderr and "Traceback" not in result.stderr


def test_predict_help_says_it_reads_csv():
    shown = run_in_process("predict", "--help").stdout
    assert "read CSV, Parquet, Delta" in " ".join(shown.split())

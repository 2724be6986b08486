"""Templates see only the environment variables they name, and never show their values.

Issue 14: ``{{ env.GITHUB_TOKEN }}`` printed the token in validate's errors (text, json, github
annotations, SARIF), ``{{ env|string }}`` listed the whole environment into MLflow params and
``spec/resolved.yaml``, template bombs hung or ate GBs, and 1,000 targets took 50 s.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import textwrap

import pytest

from dbspec.cli import main
from tests.conftest import ROOT

TOKEN = "ghp_testsecret_0123456789abcdefXYZ"
BASE = """\
name: secrets
data: {source: {kind: sklearn, name: diabetes}, task: regression}
model: {layers: [{linear: {out: 1}}]}
"""


def validate(tmp_path, body: str, *args: str) -> tuple[int, str]:
    spec = tmp_path / "spec.yaml"
    spec.write_text(body)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["validate", str(spec), *args])
    return status, out.getvalue() + err.getvalue()


@pytest.fixture
def token(monkeypatch):
    monkeypatch.setenv("DBSPEC_TEST_GITHUB_TOKEN", TOKEN)
    return TOKEN


WRONG_TYPE = BASE.replace("{out: 1}", '{out: "{{ env.DBSPEC_TEST_GITHUB_TOKEN }}"}')


@pytest.mark.parametrize("fmt", ["text", "json", "github", "sarif"])
def test_an_environment_value_is_redacted_in_every_format(tmp_path, token, fmt):
    status, printed = validate(tmp_path, WRONG_TYPE, "--format", fmt)
    assert status == 1, printed
    assert token not in printed
    assert "testsecret" not in printed
    assert "{{ env.DBSPEC_TEST_GITHUB_TOKEN }}" in printed.replace("\\", "") or fmt == "github"
    if fmt in ("json", "sarif"):
        json.loads(printed[:printed.rindex("\n1 file checked")] if "1 file" in printed
                   else printed)


def test_a_value_rendered_from_the_environment_is_redacted_too(tmp_path, token):
    body = BASE.replace("{out: 1}", '{out: "{{ env.DBSPEC_TEST_GITHUB_TOKEN | upper }}"}') + \
        'vars: {tok: "{{ env.DBSPEC_TEST_GITHUB_TOKEN }}"}\n' \
        'training: {epochs: "{{ tok | lower }}-x"}\n'
    status, printed = validate(tmp_path, body)
    assert status == 1
    assert TOKEN.upper() not in printed and TOKEN.lower() not in printed
    assert "testsecret" not in printed.lower()


@pytest.mark.parametrize("fmt", ["text", "sarif"])
def test_a_long_value_shortened_in_a_message_is_redacted(tmp_path, monkeypatch, fmt):
    long = "ghp_" + "Q7w8" * 80 + "TAIL"
    monkeypatch.setenv("DBSPEC_TEST_LONG_TOKEN", long)
    body = BASE.replace("{out: 1}", '{out: "{{ env.DBSPEC_TEST_LONG_TOKEN }}"}')
    status, printed = validate(tmp_path, body, "--format", fmt)
    assert status == 1
    assert "Q7w8Q7w8" not in printed
    assert "{{ env.DBSPEC_TEST_LONG_TOKEN }}" in printed


@pytest.mark.parametrize("expression", [
    "{{ env|string }}", "{{ env }}", "x{{ env }}", "{{ env.items()|list }}", "{{ env|list }}", "{{ env|length }}", "{{ env.__dict__ }}",
    "{{ env|pprint }}", "{{ env|dictsort }}", "{{ [env]|string }}", "{{ env.keys() }}",
    "{{ '%s'|format(env) }}", "{{ env|attr('items') }}", "{{ env.__dict__ }}",
    "{{ env['PATH' + ''] }}", "{{ [env][0] }}",
])
def test_the_environment_cannot_be_listed(tmp_path, token, expression):
    status, printed = validate(tmp_path, BASE + f'description: "{expression}"\n')
    assert status == 1, printed
    assert token not in printed
    assert "PATH" not in printed
    assert f"{tmp_path / 'spec.yaml'}:4:14: description: template refused by the sandbox: " \
        in printed, printed
    assert "the environment cannot be listed" in printed


@pytest.mark.parametrize("expression", ["{% for k in env %}{{ k }}{% endfor %}",
                                        "{{ env ~ '' }}", "{# env #}{{ 1 }}"])
def test_statements_and_jinja_only_syntax_are_refused_without_reading_the_environment(
        tmp_path, token, expression):
    status, printed = validate(tmp_path, BASE + f'description: "{expression}"\n')
    assert status == 1, printed
    assert token not in printed and "PATH" not in printed
    assert f"{tmp_path / 'spec.yaml'}:4:14: description: template " in printed, printed


def test_refusals_name_the_way_to_read_one_variable(tmp_path):
    status, printed = validate(tmp_path, BASE + 'description: "{{ env|string }}"\n')
    assert status == 1
    assert "the environment cannot be listed" in printed and "{{ env.NAME }}" in printed


def test_single_variables_and_defaults_still_work(tmp_path, token):
    body = BASE + ('description: "by {{ env.DBSPEC_TEST_GITHUB_TOKEN }} '
                   '{{ env.DBSPEC_TEST_SURELY_UNSET | default(\'nobody\') }} '
                   '{{ env[\'DBSPEC_TEST_GITHUB_TOKEN\'][:4] }}"\n')
    status, printed = validate(tmp_path, body)
    assert status == 0, printed


BOMBS = [
    "{% for i in range(100000) %}{{ 'x'*99999 }}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ '%0999999999d'|format(1) }}",
    "{{ '%0999999999d' % 1 }}",
    "{{ '{:0999999999d}'.format(1) }}",
    "{{ 'x'.center(999999999) }}",
    "{{ ('x'*99999)|replace('x', 'x'*99999) }}",
    "{{ ('x'*99999).join('x'*99999) }}",
    "{{ ('x'*99999)|join('y'*99999) }}",
    "{{ [['x']*99999]*99999 }}",
    "{% set a = 'x'*99999 %}{% set b = a~a %}{% set c = b~b %}{{ c~c~c~c }}",
    "{{ ((10**1000)**1000)**1000 }}",
    "{% set ns = namespace(s=[]) %}{% for i in range(100000) %}"
    "{% set ns.s = ns.s + ['x'*99999] %}{% endfor %}",
    "{{ range(10)|batch(999999999, 'x')|list }}",
]


def test_template_bombs_fail_fast_under_a_memory_limit(tmp_path):
    """Every bomb is refused, located, in one process limited to 1.5 GB, within 60 s total."""
    specs = []
    for index, bomb in enumerate(BOMBS):
        spec = tmp_path / f"bomb{index}.yaml"
        spec.write_text(BASE + "description: " + json.dumps(bomb) + "\n")
        specs.append(str(spec))
    script = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (1536 * 2**20, 1536 * 2**20))
        from dbspec.cli import main
        sys.exit(main(["validate", *{specs!r}]))
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    for spec in specs:
        assert f"{spec}:4:14: description: " in result.stdout, (spec, result.stdout)
    assert f"{len(BOMBS)} invalid" in result.stderr + result.stdout


def test_many_targets_are_each_validated_once_against_their_own_section(tmp_path,
                                                                        monkeypatch):
    """1,000 targets took 50 s: each target's pass validated the whole targets section."""
    from dbspec.spec import loader

    sizes = []
    real = loader._validate

    def counting(source, **kwargs):
        sizes.append(len(source.root.value.get("targets").value))
        return real(source, **kwargs)

    monkeypatch.setattr(loader, "_validate", counting)
    body = BASE + "targets:\n" + "".join(f"  t{i}: {{training: {{epochs: {i + 1}}}}}\n"
                                         for i in range(200))
    status, printed = validate(tmp_path, body)
    assert status == 0, printed
    assert len(sizes) == 201
    assert sizes[0] == 200 and set(sizes[1:]) == {1}


def test_many_search_entries_are_checked_in_linear_time(tmp_path, monkeypatch):
    """450 search entries took 38 s: each sample re-validated the whole search section."""
    from dbspec.spec import loader

    calls = []
    real = loader.apply_values

    def counting(loaded, values, **kwargs):
        calls.append(len(loaded.source.root.value.get("search", type("N", (), {"value": {}}))
                         .value))
        return real(loaded, values, **kwargs)

    monkeypatch.setattr(loader, "apply_values", counting)
    entries = 100
    body = BASE.replace("{out: 1}", '{out: "{{ used }}"}') + "vars:\n  used: 1\n" + \
        "".join(f"  v{i}: 1\n" for i in range(entries)) + \
        "search:\n  n_trials: 2\n  space:\n    vars.used: {int: [0, 4]}\n" + \
        "".join(f"    vars.v{i}: {{int: [1, 5]}}\n" for i in range(entries))
    status, printed = validate(tmp_path, body)
    assert status == 1
    assert "search.space.vars.used: the value 0 makes the spec invalid" in printed
    assert len(calls) <= 2  # only the var a template names is tried
    assert set(calls) == {0}  # without the search section


def test_a_run_logs_no_environment_value(tmp_path, monkeypatch):
    """A real run whose name and description use the environment: params and the logged
    resolved spec show ``{{ env.NAME }}``, never the value."""
    import mlflow

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DBSPEC_TEST_RUN_SECRET", "s3cr3t-run-value-9876")
    spec = tmp_path / "envrun.yaml"
    spec.write_text(textwrap.dedent("""\
        name: envrun
        description: "owner {{ env.DBSPEC_TEST_RUN_SECRET }}"
        vars: {who: "{{ env.DBSPEC_TEST_RUN_SECRET | upper }}"}
        data: {source: {kind: sklearn, name: diabetes}, task: regression}
        model: {layers: [{linear: {out: 4}}, relu, {linear: {out: 1}}]}
        training: {epochs: 1}
        tracking: {run_name: "run-{{ who }}"}
    """))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["run", str(spec), "--smoke", "--summary-json", "s.json"])
    assert code == 0, err.getvalue()[-3000:]
    summary = json.loads((tmp_path / "s.json").read_text())
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / '.dbspec' / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    params = client.get_run(summary["run_id"]).data.params
    secret = "s3cr3t-run-value-9876"
    dumped = json.dumps(params)
    assert secret not in dumped and secret.upper() not in dumped
    assert params["description"] == "owner {{ env.DBSPEC_TEST_RUN_SECRET }}"
    local = client.download_artifacts(summary["run_id"], "spec/resolved.yaml", str(tmp_path))
    text = open(local).read()
    assert secret not in text and secret.upper() not in text
    assert "{{ env.DBSPEC_TEST_RUN_SECRET }}" in text
    for path in tmp_path.rglob("resolved.yaml"):
        assert secret not in path.read_text()


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_plan_and_diff_print_no_environment_value(tmp_path, token, fmt):
    """The value of an env-templated setting shows as its template in plan and diff output."""
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    tagged = BASE + 'tracking: {tags: {owner: "%s{{ env.DBSPEC_TEST_GITHUB_TOKEN }}"}}\n'
    old.write_text(tagged % "")
    new.write_text(tagged % "team-")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        diffed = main(["diff", str(old), str(new), "--format", fmt])
        planned = main(["plan", str(new), "--format", fmt])
    printed = out.getvalue() + err.getvalue()
    assert (diffed, planned) == (0, 0), printed
    assert "tracking.tags.owner" in printed and "team-{{ env.DBSPEC_TEST_GITHUB_TOKEN }}" in printed
    assert "testsecret" not in printed

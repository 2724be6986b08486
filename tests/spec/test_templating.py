"""Templates: vars, typed whole-value expressions, env access, targets and errors."""

from __future__ import annotations

import json
import re

import pytest

from dbspec.errors import SpecError
from dbspec.spec import load_spec
from dbspec.spec.document import parse_document
from dbspec.spec.templating import render_document

BASE = """\
name: t
vars: {hidden: 8, scale: 2}
data: {source: {kind: sklearn, name: diabetes}, task: regression}
model:
  layers:
    - linear: {out: "%s"}
    - relu
    - linear: {out: 1}
"""


def render(text: str) -> dict:
    return render_document(parse_document(text)).root.to_data()


@pytest.mark.parametrize("template, expected", [
    ("{{ hidden }}", 8),
    ("{{ vars.hidden }}", 8),
    ("{{ hidden * scale }}", 16),
    ("{{ [hidden, 4] | max }}", 8),
])
def test_whole_expressions_keep_their_type(write_spec, template, expected):
    spec = load_spec(write_spec(BASE % template)).spec
    assert spec.model.layers[0].args.out == expected


def test_mixed_text_renders_to_a_string():
    data = render("name: 'run-{{ n }}'\nvars: {n: 3}\n")
    assert data["name"] == "run-3"


def test_vars_may_use_earlier_vars_and_env(monkeypatch):
    monkeypatch.setenv("DBSPEC_T_WIDTH", "5")
    data = render("vars:\n  a: '{{ env.DBSPEC_T_WIDTH | int }}'\n  b: '{{ a * 2 }}'\nx: '{{ b }}'\n")
    assert data["vars"] == {"a": 5, "b": 10} and data["x"] == 10


def test_env_default_applies_when_unset(monkeypatch):
    monkeypatch.delenv("DBSPEC_T_NOPE", raising=False)
    assert render("x: \"{{ env.DBSPEC_T_NOPE | default('dev') }}\"\n")["x"] == "dev"


def test_environment_is_not_a_bare_name(monkeypatch):
    monkeypatch.setenv("HOME_LIKE", "x")
    with pytest.raises(SpecError, match="undefined name 'HOME_LIKE'"):
        render("x: '{{ HOME_LIKE }}'\n")


def test_every_template_error_is_reported_at_once():
    with pytest.raises(SpecError) as info:
        render("a: '{{ nope }}'\nb: '{{ 1 + }}'\nc: '{{ 1 / 0 }}'\n")
    messages = [d.message for d in info.value.diagnostics]
    assert len(messages) == 3
    assert "undefined name 'nope'" in messages[0]
    assert "template syntax error" in messages[1]
    assert "ZeroDivisionError" in messages[2]


def test_sandbox_blocks_attribute_escapes():
    with pytest.raises(SpecError, match="sandbox"):
        render("a: \"{{ ''.__class__.__mro__ }}\"\n")


def test_a_template_can_produce_a_list():
    data = render("vars: {n: 3}\nshape: '{{ [1, n, n] }}'\n")
    assert data["shape"] == [1, 3, 3]


def test_templates_in_targets_see_vars(write_spec):
    text = BASE % "{{ hidden }}" + "targets:\n  big:\n    vars: {hidden: 64}\n"
    assert load_spec(write_spec(text), target="big").spec.model.layers[0].args.out == 64


def test_whitespace_control_is_accepted(write_spec):
    spec = load_spec(write_spec(BASE % "{{- hidden -}}")).spec
    assert spec.model.layers[0].args.out == 8


@pytest.mark.parametrize("template", ["{{ 'x' * 100000000 }}", "{{ 2 ** 100000 }}",
                                      "{{ lipsum(100000, false, 10000, 100000) }}"])
def test_templates_cannot_blow_up(template):
    with pytest.raises(SpecError) as info:
        render(f'a: "{template}"\n')
    (diag,) = info.value.diagnostics
    assert len(diag.message) < 300


def test_unselected_targets_are_not_rendered(write_spec, monkeypatch):
    monkeypatch.delenv("DBSPEC_T_PROD", raising=False)
    text = BASE % "{{ hidden }}" + ("targets:\n  dev: {default: true}\n"
                                    "  prod: {tracking: {experiment: '{{ env.DBSPEC_T_PROD }}'}}\n")
    assert load_spec(write_spec(text)).target == "dev"
    with pytest.raises(SpecError, match="environment variable 'DBSPEC_T_PROD' is not set"):
        load_spec(write_spec(text), target="prod")


@pytest.mark.parametrize("template, refusal", [
    ("{{ 'x'.center(999999999) }}", "values have no attributes or methods"),
    ("{{ ''.__class__ }}", "values have no attributes or methods"),
    ("{{ 'x'|indent(999999999) }}", "no filter named 'indent'"),
    ("{{ '{:{}}'.format(1, 999999999) }}", "template syntax error"),
    ("{{ '%0999999999d' % 1 }}", "'%' formatting of text is not offered"),
    ("{{ max(1, 2) }}", "Call expressions are not offered"),
    ("{{ env.items()|list }}", "the environment cannot be listed"),
    ("{{ env[name] }}", "the environment cannot be listed"),
    ("{% set a = 'x'*99999 %}{{ a }}", r"statements and comments \(\{% %\}, \{# #\}\) are not"),
    ("{% for i in range(3) %}{{ i }}{% endfor %}", "statements and comments"),
    ("{{ ('x'*99999)|replace('x', 'y'*40000) }}", "the result would exceed 100,000"),
    ("{{ ('x'*99999)|join('y'*99999) }}", "the result would exceed 100,000"),
    ("{{ [['x']*99999]*99999 }}", "the result would exceed 100,000"),
    ("{{ ((10**1000)**1000)**1000 }}", "the result would exceed 100,000 bits"),
    ("{{ 'a' ~ 'b' }}", "template syntax error"),
    ("{{ 1 + }}", "template syntax error"),
    ("x {{ 1", "'{{' without '}}'"),
    ("{{ [x for x in 'ab'] }}", "ListComp expressions are not offered"),
    ("{{ " + "-" * 3000 + "1 }}", r"too large or too deep \(RecursionError\)"),
])
def test_a_limit_refuses_before_the_value_is_built(template, refusal):
    """Nothing is built past a limit, and what is not offered is named, located."""
    with pytest.raises(SpecError) as info:
        render(f"a: {json.dumps(template)}\n")
    (diag,) = info.value.diagnostics
    assert (diag.line, diag.column) == (1, 4) and re.search(refusal, diag.message), diag.message


@pytest.mark.parametrize("template, expected", [
    ("{{ 3.14159 | round(2) }}", 3.14), ("{{ [3, 1] | max }}", 3), ("{{ [1] * 3 }}", [1, 1, 1]),
    ("{{ [1, 2]|join(',') }}", "1,2"), ("{{ 'a-b'|replace('-', '_') }}", "a_b"),
    ("a {{- 1 -}} b", "a1b"), ("a {{ 1 }} b", "a 1 b"), ("{{ 'Ab' | lower }}{{ 2 }}", "ab2"),
    ("{{ vars.cfg.depth + cfg['depth'] }}", 6), ("{{ (cfg.depth * 1.5) | int }}", 4),
    ("{{ [1, 2, 3][1:] }}", [2, 3]), ("{{ -cfg.depth ** 2 }}", -9),
    ("{{ nope | default }}", ""), ("{{ cfg.nope | default(2) }}", 2),
])
def test_the_checked_operations_still_work(template, expected):
    assert render(f"vars: {{cfg: {{depth: 3}}}}\na: {json.dumps(template)}\n")["a"] == expected


def test_a_missing_key_says_which_keys_there_are():
    with pytest.raises(SpecError, match=r"'dept' is not a key of the mapping \(did you mean 'depth'"):
        render("vars: {cfg: {depth: 3}}\na: '{{ cfg.dept }}'\n")

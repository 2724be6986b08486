"""YAML parsing: positions, duplicates, merge keys and the limits on hostile input."""

from __future__ import annotations

import pytest

from dbspec.errors import SpecError, UsageError
from dbspec.spec.document import MAX_BYTES, parse_document, read_document


def test_every_node_keeps_line_and_column():
    doc = parse_document("name: x\ndata:\n  source: {kind: csv, path: a.csv}\n", "f.yaml")
    _, node, found = doc.locate(("data", "source", "path"))
    assert found
    assert (node.line, node.column) == (3, 29)
    assert (node.key_line, node.key_column) == (3, 23)


def test_locate_skips_elements_not_in_the_document():
    doc = parse_document("compute:\n  kind: deepspeed\n  zero_stage: 9\n")
    matched, node, found = doc.locate(("compute", "deepspeed", "zero_stage"))
    assert matched == ("compute", "zero_stage") and found and node.value == 9


def test_scalars_are_typed_but_keys_stay_strings():
    doc = parse_document("a: 1\nb: 1.5\nc: true\nd: null\n'on': 2\nyes: 3\n")
    data = doc.root.to_data()
    assert data == {"a": 1, "b": 1.5, "c": True, "d": None, "on": 2, "yes": 3}


def test_dates_stay_as_written():
    doc = parse_document("t: 2024-05-01T12:00:00Z\n")
    assert doc.root.to_data() == {"t": "2024-05-01T12:00:00Z"}


def test_merge_keys_and_anchors():
    doc = parse_document("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\n")
    assert doc.root.to_data()["other"] == {"x": 1, "y": 3}


def test_duplicate_keys_are_errors_with_both_places():
    with pytest.raises(SpecError) as info:
        parse_document("a:\n  b: 1\n  b: 2\n", "f.yaml")
    (diag,) = info.value.diagnostics
    assert (diag.line, diag.column, diag.path) == (3, 3, "a.b")
    assert "first defined at line 2" in diag.message


def test_alias_bomb_is_refused():
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 9):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    with pytest.raises(SpecError, match="expands to more than"):
        parse_document("\n".join(lines))


def test_recursive_alias_is_refused():
    with pytest.raises(SpecError, match="nesting is deeper"):
        parse_document("a: &a [*a]\n")


def test_deep_nesting_is_refused():
    text = "a: " + "[" * 200 + "]" * 200 + "\n"
    with pytest.raises(SpecError, match="nesting is deeper"):
        parse_document(text)


def test_huge_file_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * MAX_BYTES + "\nname: x\n")
    with pytest.raises(SpecError, match="larger than"):
        read_document(str(path))


@pytest.mark.parametrize("make, message", [
    (lambda p: p, "no such file"),
    (lambda p: p.parent, "is a directory"),
])
def test_unreadable_paths_are_usage_errors(tmp_path, make, message):
    with pytest.raises(UsageError, match=message):
        read_document(str(make(tmp_path / "missing.yaml")))


def test_multiple_documents_are_an_error():
    with pytest.raises(SpecError, match="invalid YAML"):
        parse_document("name: a\n---\nname: b\n")


def test_non_string_keys_are_errors():
    with pytest.raises(SpecError, match="keys must be plain strings"):
        parse_document("? [a, b]\n: 1\n")

"""The committed JSON schema is current, and specs validate against it as an editor sees them."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from dbspec.spec.schema import schema_text, spec_schema
from tests.conftest import MINIMAL, ROOT, SPECS

COMMITTED = ROOT / "schemas" / "dbspec.schema.json"


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(COMMITTED.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_committed_schema_is_current():
    assert COMMITTED.read_text() == schema_text(), \
        "schemas/dbspec.schema.json is stale: run `dbspec schema -o schemas/dbspec.schema.json`"


def test_schema_is_draft_2020_12():
    assert spec_schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_every_field_has_a_description():
    missing = []

    def walk(node, where):
        if isinstance(node, dict):
            for name, prop in node.get("properties", {}).items():
                if "description" not in prop:
                    missing.append(f"{where}.{name}")
            for key, value in node.items():
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    walk(spec_schema(), "#")
    assert missing == []


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_example_specs_validate_against_the_committed_schema(path, validator):
    first_line = path.read_text().splitlines()[0]
    assert first_line == "# yaml-language-server: $schema=../schemas/dbspec.schema.json"
    errors = list(validator.iter_errors(yaml.safe_load(path.read_text())))
    assert errors == [], [e.message for e in errors]


def test_schema_admits_templates_where_numbers_go(validator):
    data = yaml.safe_load(MINIMAL)
    data["model"]["layers"][0] = {"linear": {"out": "{{ hidden }}"}}
    data["training"] = {"epochs": "{{ env.EPOCHS | default(3) }}"}
    assert list(validator.iter_errors(data)) == []


@pytest.mark.parametrize("mutate", [
    lambda d: d["data"].update(taget="y"),
    lambda d: d["model"]["layers"].append({"lineer": {"out": 1}}),
    lambda d: d["model"]["layers"].append({"linear": {"out": 1}, "relu": {}}),
    lambda d: d.update(compute={"kind": "deepspeeed"}),
    lambda d: d["model"]["layers"][0]["linear"].update(out="eight"),
])
def test_schema_rejects_what_the_loader_rejects(validator, mutate):
    data = yaml.safe_load(MINIMAL)
    mutate(data)
    assert list(validator.iter_errors(data)) != []

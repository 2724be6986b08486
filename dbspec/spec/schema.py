"""The JSON schema (draft 2020-12) of a spec, as editors and ``dbspec schema`` see it."""

from __future__ import annotations

import json
from typing import Any

from pydantic.json_schema import GenerateJsonSchema

from dbspec.spec.sections import Spec

SCHEMA_ID = "https://dbspec.dev/schemas/dbspec.schema.json"
#: A whole-value template such as ``"{{ hidden }}"``: admitted wherever a typed value goes,
#: because editors see the spec before rendering.
TEMPLATE = {"type": "string", "pattern": r"\{\{.*\}\}|\{%.*%\}", "title": "template"}


class _SpecJsonSchema(GenerateJsonSchema):
    """pydantic's generator, with templates admitted for non-string scalars."""

    def int_schema(self, schema):
        return _templatable(super().int_schema(schema))

    def float_schema(self, schema):
        return _templatable(super().float_schema(schema))

    def bool_schema(self, schema):
        return _templatable(super().bool_schema(schema))

    def literal_schema(self, schema):
        result = super().literal_schema(schema)
        # single-value literals are union discriminators (kind, name): keep them exact so
        # oneOf still picks one branch
        return _templatable(result) if len(schema["expected"]) > 1 else result

    def generate(self, schema, mode="validation"):
        result = super().generate(schema, mode)
        result["$schema"] = self.schema_dialect
        result["$id"] = SCHEMA_ID
        return result


def _templatable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, dict(TEMPLATE)]}


def spec_schema() -> dict[str, Any]:
    """The JSON schema of :class:`Spec`."""
    return Spec.model_json_schema(schema_generator=_SpecJsonSchema)


def schema_text() -> str:
    """The schema as committed in ``schemas/dbspec.schema.json`` (stable key order)."""
    return json.dumps(spec_schema(), indent=2, sort_keys=True) + "\n"

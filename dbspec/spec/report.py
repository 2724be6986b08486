"""Diagnostics for machines: GitHub workflow annotations and SARIF 2.1.0 for code scanning."""

from __future__ import annotations

import os
from typing import Any, Sequence

from dbspec.errors import Diagnostic

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_INFO_URI = "https://github.com/dbspec/dbspec#checking-specs-dbspec-validate"


def github_annotation(diag: Diagnostic) -> str:
    """``::error file=...,line=...,col=...,title=...::message`` for GitHub Actions."""

    def escape(text: str) -> str:
        return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    def escape_property(text: str) -> str:
        return escape(text).replace(":", "%3A").replace(",", "%2C")

    diag = diag.redacted()
    where = f"file={escape_property(diag.file)}"
    if diag.line:
        where += f",line={diag.line},col={diag.column}"
    title = escape_property(diag.path or "dbspec")
    return f"::{diag.severity} {where},title={title}::{escape(diag.message)}"


def rule_id(diag: Diagnostic) -> str:
    """One rule per top-level spec section (``dbspec/training``), so code scanning groups them."""
    section = diag.path.split(".", 1)[0].split("[", 1)[0] if diag.path else "document"
    return f"dbspec/{section or 'document'}"


def sarif(results: Sequence[Diagnostic], *, version: str) -> dict[str, Any]:
    """A SARIF 2.1.0 log with one run of dbspec; file URIs relative to the working directory."""
    results = [d.redacted() for d in results]
    rules = sorted({rule_id(d) for d in results})
    index = {rule: i for i, rule in enumerate(rules)}
    findings = []
    for diag in results:
        location: dict[str, Any] = {"artifactLocation": {"uri": _uri(diag.file),
                                                         "uriBaseId": "%SRCROOT%"}}
        if diag.line:
            location["region"] = {"startLine": diag.line, "startColumn": max(diag.column, 1)}
        text = (f"{diag.path}: " if diag.path else "") + diag.message + (
            f" [from {diag.origin}]" if diag.origin else "")
        findings.append({"ruleId": rule_id(diag), "ruleIndex": index[rule_id(diag)],
                         "level": diag.severity,
                         "message": {"text": text},
                         "locations": [{"physicalLocation": location}],
                         "properties": {"specPath": diag.path}})
    driver = {"name": "dbspec", "version": version, "informationUri": _INFO_URI,
              "rules": [{"id": rule, "name": rule.split("/", 1)[1],
                         "shortDescription": {"text": f"dbspec spec check: the "
                                                      f"{rule.split('/', 1)[1]} section"},
                         "defaultConfiguration": {"level": "error"}} for rule in rules]}
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0",
            "runs": [{"tool": {"driver": driver}, "results": findings,
                      "columnKind": "unicodeCodePoints"}]}


def _uri(file: str) -> str:
    path = os.path.relpath(file) if os.path.isabs(file) else file
    if path.startswith(".."):
        path = os.path.abspath(file)
    return path.replace(os.sep, "/")

"""Every broken spec in tests/assets/invalid gets the located errors its header promises.

Each file lists its expected diagnostics as ``# expect: LINE:COL: path: message-prefix``
comments; the test checks each one appears, that the CLI exits 1 and prints no traceback.
"""

from __future__ import annotations

import contextlib
import io

import pytest

from dbspec.cli import main
from tests.conftest import ASSETS

INVALID = sorted((ASSETS / "invalid").glob("*.yaml"))


def expectations(path) -> list[str]:
    text = path.read_bytes().decode("utf-8", errors="replace")
    return [line.split("# expect: ", 1)[1].strip() for line in text.splitlines()
            if line.startswith("# expect: ")]


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_spec_reports_located_errors(path, monkeypatch):
    monkeypatch.delenv("DBSPEC_TEST_SURELY_UNSET", raising=False)
    expected = expectations(path)
    assert expected, f"{path.name} declares no '# expect:' lines"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(["validate", str(path)])
    printed = out.getvalue()
    assert status == 1, printed
    assert "Traceback" not in printed
    for want in expected:
        assert any(line.startswith(f"{path}:{want}") for line in printed.splitlines()), \
            f"missing '{want}' in:\n{printed}"


def test_every_invalid_asset_is_exercised():
    assert len(INVALID) >= 20

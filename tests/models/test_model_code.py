"""Which dbspec modules travel with a logged model: those the served model imports, found in the
source, and the quiet artifact downloads of dbspec's own model loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dbspec
from dbspec.models import portable
from dbspec.models.portable import copy_served_code, custom_code, served_modules

ENTRY = "dbspec.models.pyfunc"


def test_the_served_model_needs_its_own_modules_not_all_of_dbspec():
    found = served_modules(ENTRY)
    for name in ("dbspec", "dbspec.errors", "dbspec.models", "dbspec.models.served",
                 "dbspec.models.inputs", "dbspec.models.network", "dbspec.models.portable",
                 "dbspec.data", "dbspec.data.prepare", "dbspec.spec", "dbspec.spec.sections",
                 "dbspec.spec.sections.network",
                 # the spec's unions load every built-in kind through its registry's name
                 "dbspec.sources.csv", "dbspec.sources.spark_table", "dbspec.compute.deepspeed"):
        assert name in found, name
    for name in ("dbspec.cli", "dbspec.serving", "dbspec.executors", "dbspec.tracking",
                 "dbspec.training"):
        assert not [m for m in found if m == name or m.startswith(name + ".")], name
    every = list(Path(dbspec.__file__).parent.rglob("*.py"))
    assert len(found) < len(every) / 2


def test_everything_loading_the_served_model_imports_is_found():
    """The cross-check by importing, in a clean process: what the load path pulls into
    ``sys.modules`` lies within what the source says it may import."""
    script = textwrap.dedent("""\
        import json, sys
        import dbspec.models.pyfunc, dbspec.models.served, dbspec.models.inputs
        import dbspec.models.portable
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "dbspec")))
        """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    imported = set(json.loads(out.strip().splitlines()[-1]))
    assert imported - set(served_modules(ENTRY)) == set()


@pytest.fixture
def fake_dbspec(tmp_path, monkeypatch):
    """A small ``dbspec`` tree to read imports from instead of the real one."""
    def write(files: dict[str, str]) -> Path:
        for relative, text in files.items():
            path = tmp_path / "dbspec" / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        monkeypatch.setattr(portable, "_DBSPEC_DIR", tmp_path / "dbspec")
        return tmp_path / "dbspec"

    return write


def test_imports_are_followed_in_every_form(fake_dbspec):
    fake_dbspec({
        "__init__.py": "",
        "entry.py": """\
            import os
            from . import near
            from .pkg import sub
            import dbspec.absolute as renamed

            def predict():
                from dbspec.lazy import thing  # only at predict time
                import importlib
                return importlib.import_module("dbspec.by_name")
            """,
        "near.py": "from .pkg.deep import leaf\n",
        "pkg/__init__.py": "from dbspec.heavy_init import x  # a package __init__'s import\n",
        "pkg/sub.py": "from ..errors import E\n",
        "pkg/deep/__init__.py": "",
        "pkg/deep/leaf.py": "",
        "absolute.py": "", "lazy.py": "", "by_name.py": "", "heavy_init.py": "",
        "errors.py": "",
        "unused.py": "import dbspec.also_unused\n", "also_unused.py": "",
    })
    assert sorted(served_modules("dbspec.entry")) == [
        "dbspec", "dbspec.absolute", "dbspec.by_name", "dbspec.entry", "dbspec.errors",
        "dbspec.heavy_init", "dbspec.lazy", "dbspec.near", "dbspec.pkg", "dbspec.pkg.deep",
        "dbspec.pkg.deep.leaf", "dbspec.pkg.sub"]


def test_the_copy_keeps_dbspecs_layout(fake_dbspec, tmp_path):
    fake_dbspec({"__init__.py": "", "a/__init__.py": "", "a/b.py": "import dbspec.c\n",
                 "c.py": "", "d.py": ""})
    copied = Path(copy_served_code(tmp_path / "staging", ["dbspec.a.b"]))
    assert copied.name == "dbspec"  # MLflow names the code path's copy after its directory
    assert sorted(p.relative_to(copied).as_posix() for p in copied.rglob("*.py")) == [
        "__init__.py", "a/__init__.py", "a/b.py", "c.py"]


def test_a_custom_class_inside_dbspec_travels_with_it():
    found = custom_code({"custom": {"class": "dbspec.models.network:ModelError"}})
    assert found.code_paths == [] and found.dbspec_modules == ["dbspec.models.network"]


def test_dbspecs_own_loads_show_no_download_bars(monkeypatch):
    from mlflow.utils.file_utils import ArtifactProgressBar

    from dbspec.tracking.mlflow_tracking import artifact_progress_bars_off

    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    monkeypatch.delenv(name, raising=False)
    with artifact_progress_bars_off():
        with artifact_progress_bars_off():  # a second load in another thread, say
            pass
        with ArtifactProgressBar.files(desc="Downloading artifacts", total=3) as bar:
            assert bar.pbar is None
    assert name not in os.environ  # the caller's own downloads keep MLflow's default
    monkeypatch.setenv(name, "true")
    with artifact_progress_bars_off():
        assert os.environ[name] == "true"  # what the user chose stays

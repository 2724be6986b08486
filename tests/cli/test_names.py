"""Names are names: target names, spec names and run keys used in paths are checked, every path
dbspec writes stays inside its root, and git never takes a spec argument for an option."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_main

SPEC = """\
name: t
data: {source: {kind: sklearn, name: diabetes}, task: regression}
model: {layers: [{linear: {out: 1}}]}
targets:
  dev: {}
  %s: {mode: production}
"""
ESCAPE = "../../../../escape"


# -- the containment helper -----------------------------------------------------------------

def test_inside_accepts_paths_below_the_root(tmp_path):
    from dbspec.paths import inside

    assert inside(tmp_path, "a", "b.yml") == tmp_path / "a" / "b.yml"
    assert inside(tmp_path, "a/./b/../c") == tmp_path / "a/./b/../c"  # folds back inside
    assert inside(tmp_path) == tmp_path
    assert inside(tmp_path / "not-yet", "x") == tmp_path / "not-yet" / "x"


@pytest.mark.parametrize("parts", [("..",), ("a", "..", "..", "x"), ("../x",), ("a/../../x",),
                                   ("/etc/passwd",), ("a", "/tmp/x")])
def test_inside_refuses_dotdot_and_absolute_parts(tmp_path, parts):
    from dbspec.paths import PathEscape, inside

    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(PathEscape, match="outside"):
        inside(root, *parts)


def test_inside_follows_symlinks(tmp_path):
    from dbspec.paths import PathEscape, inside

    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "link").symlink_to(elsewhere)
    (root / "file-link").symlink_to(elsewhere / "f")
    with pytest.raises(PathEscape):
        inside(root, "link", "x.yml")
    with pytest.raises(PathEscape):
        inside(root, "file-link")
    (root / "inner").mkdir()
    (root / "ok-link").symlink_to(root / "inner")
    assert inside(root, "ok-link", "x") == root / "ok-link" / "x"
    linked_root = tmp_path / "linked-root"
    linked_root.symlink_to(root)  # the root itself may be a link
    assert inside(linked_root, "a") == linked_root / "a"


def test_names_are_checked_against_the_pattern():
    from dbspec.errors import UsageError
    from dbspec.paths import check_name, is_name

    for good in ("dev", "job-7", "123", "a.b_c-d"):
        assert is_name(good)
    for bad in ("", "..", ".hidden", "-rf", "a/b", "a\\b", "x" * 129, "a b", "a\nb"):
        assert not is_name(bad), bad
    with pytest.raises(UsageError, match="--run-key '../x': not a valid name"):
        check_name("../x", "--run-key")


# -- spec validation ------------------------------------------------------------------------

def test_a_traversal_target_name_is_a_located_error(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC % ESCAPE)
    code, out, _ = run_main("validate", str(spec))
    assert code == 1
    assert f"{spec}:6:" in out and f"targets.{ESCAPE}: target name '{ESCAPE}' is not allowed" \
        in out


# -- the CLI writes nothing outside its roots ------------------------------------------------

def test_jobs_writes_nothing_outside_the_output_directory(tmp_path):
    spec = tmp_path / "project" / "s.yaml"
    spec.parent.mkdir()
    spec.write_text(SPEC % "../../../../../escape")
    out = tmp_path / "project" / "out"
    code, _, err = run_main("jobs", str(spec), "-o", str(out))
    assert code == 1, err
    assert "is not allowed" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]
    assert not out.exists()


def test_jobs_does_not_write_through_a_symlink_out_of_the_output_directory(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC % "prod")
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "resources").symlink_to(elsewhere)
    code, _, err = run_main("jobs", str(spec), "-o", str(out))
    assert code == 1 and "outside" in err, err
    assert list(elsewhere.iterdir()) == []
    assert not (out / "databricks.yml").exists()  # nothing written: every path checked first


def test_run_with_a_traversal_target_writes_no_state_outside_the_state_dir(workdir):
    (workdir / "s.yaml").write_text(SPEC % ESCAPE)
    code, _, err = run_main("run", "s.yaml", "--target", ESCAPE, "--only", "load_data", "-q",
                            "--state-dir", "sd")
    assert code != 0
    assert "escape" not in {p.name for p in workdir.rglob("*") if "sd" not in p.parts}
    assert not (workdir.parent / "escape").exists()


@pytest.mark.parametrize("option, value", [("--target", "../x"), ("--target", "-x"),
                                           ("--run-key", "../../k"), ("--run-key", "a/b")])
def test_cli_names_are_usage_errors(workdir, option, value):
    (workdir / "s.yaml").write_text(SPEC % "prod")
    code, _, err = run_main("run", "s.yaml", "-q", "--state-dir", "sd", f"{option}={value}")
    assert code == 2
    assert f"{option} {value!r}: not a valid name" in err
    assert not (workdir / "sd").exists()


def test_jobs_target_option_is_checked(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC % "prod")
    code, _, err = run_main("jobs", str(spec), "--target=../../x", "-o", str(tmp_path / "o"))
    assert code == 2 and "--target '../../x': not a valid name" in err


def test_the_executors_state_layout_stays_inside_the_state_dir(tmp_path):
    from types import SimpleNamespace

    from dbspec.executors.local import LocalExecutor
    from dbspec.executors.state import LocalState
    from dbspec.paths import PathEscape
    from dbspec.stages.base import Reporter, RunOptions, StageContext

    loaded = SimpleNamespace(spec=SimpleNamespace(name="t"), target=ESCAPE)
    with pytest.raises(PathEscape):
        LocalExecutor(tmp_path / "sd").run_dir(loaded)
    with pytest.raises(PathEscape):
        LocalState(tmp_path / "sd" / "runs" / "t").stage_dir("../../../x")
    ctx = StageContext(loaded=None, directory=tmp_path / "train", project_dir=tmp_path,
                       upstream={}, upstream_dirs={}, reporter=Reporter(enabled=False),
                       options=RunOptions(shared_dir=str(tmp_path / "shared")),
                       run_name="../../x")
    with pytest.raises(PathEscape):
        ctx.shared_stage_dir()


# -- git never takes an argument for an option ------------------------------------------------

def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd,
                   check=True, capture_output=True)


@pytest.fixture
def repo(workdir):
    _git(workdir, "init", "-q")
    (workdir / "s.yaml").write_text(SPEC % "prod")
    _git(workdir, "add", "s.yaml")
    _git(workdir, "commit", "-q", "-m", "spec")
    return workdir


@pytest.mark.parametrize("given", ["--output=F:x", "--output=F:s.yaml", "-oF:s.yaml"])
def test_diff_refuses_a_revision_that_looks_like_an_option(repo, given):
    code, out, err = run_main("diff", "--", given, "s.yaml")
    assert code == 2, out + err
    assert "is not a git revision" in err
    assert not (repo / "F").exists()
    assert sorted(os.listdir(repo)) == [".git", "s.yaml"]


def test_diff_still_reads_a_revision(repo):
    (repo / "s.yaml").write_text("description: changed\n" + SPEC % "prod")
    code, out, err = run_main("diff", "HEAD:s.yaml", "s.yaml")
    assert code == 0, err
    assert 'description: "" -> "changed"' in out

"""``dbspec init``: a first spec from a data file, that validates and runs."""

from __future__ import annotations

import re
import shlex
import warnings

import pytest

from tests.conftest import run_in_process


@pytest.fixture(scope="module")
def wine_csv(tmp_path_factory):
    """scikit-learn's wine data as a CSV with a text column and a few missing values."""
    from sklearn.datasets import load_wine

    frame = load_wine(as_frame=True).frame
    frame.insert(0, "batch id", [f"b{i % 7}" for i in range(len(frame))])
    frame.loc[[3, 40], "ash"] = None
    path = tmp_path_factory.mktemp("init") / "Wine Quality.csv"
    frame.to_csv(path, index=False)
    return path


def test_init_writes_a_spec_that_validates_and_runs(wine_csv, workdir):
    made = run_in_process("init", str(wine_csv), cwd=workdir)
    assert made.returncode == 0, made.stderr
    # the file keeps the data file's stem (it was wine-quality.yaml); the spec name is a name
    assert "wrote Wine Quality.yaml: multiclass on 13 feature(s), target 'target'; left out " \
           "(not numeric): batch id" in made.stderr
    hint = made.stderr.split("next: ")[1].strip()
    assert hint == "dbspec validate 'Wine Quality.yaml' && dbspec run 'Wine Quality.yaml' --smoke"
    text = (workdir / "Wine Quality.yaml").read_text()
    assert "name: wine-quality" in text
    assert "task: multiclass  # inferred: the target has 3 distinct values" in text
    assert "preprocessing: [impute, standard_scale]" in text  # 'ash' has missing values
    assert "- linear: {out: 3}" in text and '"batch id"' not in text.split("features:")[1][:20]
    checked = run_in_process(*shlex.split(hint.split(" && ")[0])[1:], cwd=workdir)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ran = run_in_process(*shlex.split(hint.split(" && ")[1])[1:], "-q", cwd=workdir,
                             timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert re.search(r"model version +wine_quality_smoke v1", ran.stdout), ran.stdout
    # the CSV is logged as its file, without MLflow's "can be interpreted in multiple ways"
    assert not [w for w in caught if "multiple ways" in str(w.message)]


def test_init_names_the_spec_after_the_file_stem(tmp_path):
    (tmp_path / "breast_cancer.csv").write_text("a,target\n1,0\n2,1\n3,0\n")
    made = run_in_process("init", "breast_cancer.csv", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "breast_cancer.yaml").exists()  # was breast-cancer.yaml
    assert not (tmp_path / "breast-cancer.yaml").exists()


def test_init_takes_the_label_column_as_label_and_target_with_a_warning(tmp_path):
    (tmp_path / "rows.csv").write_text("a,b,c\n1,2,3\n2,3,4\n3,4,5\n")
    made = run_in_process("init", "rows.csv", "--label", "a", "-o", "l.yaml", cwd=tmp_path)
    assert made.returncode == 0 and "deprecated" not in made.stderr, made.stderr
    old = run_in_process("init", "rows.csv", "--target", "a", "-o", "t.yaml", cwd=tmp_path)
    assert old.returncode == 0, old.stderr
    assert "warning: --target is deprecated; use --label" in old.stderr
    assert "target: a" in (tmp_path / "l.yaml").read_text()
    assert "target: a" in (tmp_path / "t.yaml").read_text()
    assert "--target" not in run_in_process("init", "--help").stdout


def test_init_infers_binary_and_regression_and_takes_overrides(tmp_path):
    (tmp_path / "rows.csv").write_text("a;b;label\n1;2.5;yes\n2;3.5;no\n3;1.5;yes\n")
    made = run_in_process("init", "rows.csv", "--delimiter", ";", "-o", "b.yaml", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    text = (tmp_path / "b.yaml").read_text()
    assert "target: label" in text and "task: binary" in text and 'delimiter: ";"' in text
    made = run_in_process("init", "rows.csv", "--delimiter", ";", "--label", "b", "-o",
                          "r.yaml", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    text = (tmp_path / "r.yaml").read_text()
    assert "target: b" in text and "task: regression" in text and "features: [a]" in text
    assert run_in_process("validate", "b.yaml", "r.yaml", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("content, args, message", [
    (None, [], "does not exist"),
    ("a,b\n1,2\n", ["--label", "c"], "--label 'c' is not a column of rows.csv"),
    ("x,target\nu,1\nv,2\n", [], "no numeric column besides the target 'target'"),
    ("a,target\n1,\n2,3\n", [], "the target column 'target' has 1 missing value(s)"),
    ("a,target\n1,x\n2,y\n3,z\n", ["--task", "regression"], "regression needs numbers"),
    ("a,a,target\n1,2,3\n", [], "rows.csv:1: repeated column name(s) 'a'"),
    ("a,target\n1,2,3\n", [], "rows.csv:2: 3 fields, the header has 2"),
    ("a,target\n", [], "a header and no rows"),
])
def test_init_errors_are_one_line(tmp_path, content, args, message):
    if content is not None:
        (tmp_path / "rows.csv").write_text(content)
    done = run_in_process("init", "rows.csv", *args, cwd=tmp_path)
    assert done.returncode == 1 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "rows.yaml").exists()


def test_init_keeps_an_existing_spec_unless_forced(tmp_path):
    (tmp_path / "rows.csv").write_text("a,target\n1,2.5\n2,3.5\n3,1.25\n")
    (tmp_path / "rows.yaml").write_text("mine\n")
    kept = run_in_process("init", "rows.csv", cwd=tmp_path)
    assert kept.returncode == 2 and "rows.yaml exists; give another -o, or --force" in kept.stderr
    assert (tmp_path / "rows.yaml").read_text() == "mine\n"
    assert run_in_process("init", "rows.csv", "--force", cwd=tmp_path).returncode == 0
    assert "task: regression" in (tmp_path / "rows.yaml").read_text()


def test_a_binary_model_says_which_class_its_probability_is_of(workdir):
    rows = "\n".join(f"{i % 7},{(i * 3) % 5},{'yes' if i % 7 > 3 else 'no'}" for i in range(60))
    (workdir / "churn.csv").write_text("a,b,churned\n" + rows + "\n")
    assert run_in_process("init", "churn.csv", cwd=workdir).returncode == 0
    ran = run_in_process("run", "churn.yaml", "--smoke", "-q", cwd=workdir, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    scored = run_in_process("predict", "models:/churn_smoke/1", "--input", "churn.csv",
                            "--output", "scored", "--format", "parquet", cwd=workdir)
    assert scored.returncode == 0, scored.stderr
    assert "probability = P(prediction = 'yes')" in scored.stdout + scored.stderr


def test_init_on_100000_columns_writes_a_spec_that_validates(tmp_path):
    """Every repeated-name and feature check is linear (they were quadratic: past 300 s), and a
    feature list too long for a spec is left to the default, which names the same columns."""
    columns = [f"f{i}" for i in range(100_000)]
    rows = "\n".join(",".join(f"{(r * 7 + i) % 10}.5" for i in range(100_001)) for r in range(3))
    (tmp_path / "wide.csv").write_text(",".join(columns) + ",target\n" + rows + "\n")
    made = run_in_process("init", "wide.csv", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "regression on 100000 feature(s), target 'target'" in made.stderr
    text = (tmp_path / "wide.yaml").read_text()
    assert "# features: every column but the target (100,000, too many to list)" in text
    assert "  features: [" not in text
    checked = run_in_process("validate", "wide.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_init_lists_many_features_when_a_column_is_left_out(tmp_path):
    names = [f"f{i}" for i in range(1_001)]
    (tmp_path / "rows.csv").write_text(",".join(names) + ",note,target\n"
                                       + ",".join("1" for _ in names) + ",x,2.5\n"
                                       + ",".join("2" for _ in names) + ",y,3.5\n")
    assert run_in_process("init", "rows.csv", cwd=tmp_path).returncode == 0
    text = (tmp_path / "rows.yaml").read_text()
    assert "  features: [f0, f1, " in text and "f1000]" in text and "left out: note" in text

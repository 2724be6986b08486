"""Reruns of a search: the best trial's model after --from tune, and a named study that the
spec's search no longer matches."""

from __future__ import annotations

from tests.conftest import ROOT
from tests.conftest import run_main as run

SPECS = ROOT / "specs"


def test_best_trial_model_survives_a_rerun_of_tune(workdir):
    text = (SPECS / "breast_cancer_search.yaml").read_text().replace(
        "  direction: minimize\n", "  direction: minimize\n  final_model: best_trial\n")
    (workdir / "s.yaml").write_text(text)
    assert run("run", "s.yaml", "--smoke", "-q")[0] == 0
    code, _, err = run("run", "s.yaml", "--smoke", "-q", "--from", "tune")
    assert code == 0, err


def test_a_named_study_refuses_a_changed_search(workdir):
    spec = str(SPECS / "breast_cancer_search.yaml")
    named = ["--set", "search.study_name=fixed", "--smoke", "-q"]
    assert run("run", spec, *named)[0] == 0
    code, _, err = run("run", spec, *named, "--set", "search.sampler.name=random")
    assert code == 1 and "was made for a different search" in err

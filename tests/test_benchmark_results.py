"""``benchmarks/RESULTS.md``: a goal met in a benchmark stays met in the figures its script last
wrote there (``--results``); a change that loses it shows when the script is rerun."""

from __future__ import annotations

import re

from tests.conftest import ROOT

RESULTS = ROOT / "benchmarks" / "RESULTS.md"


def section(script: str) -> str:
    """What ``script --results`` wrote between its markers."""
    text = RESULTS.read_text()
    begin, end = f"<!-- begin: written by {script} --results -->", f"<!-- end: {script} -->"
    assert begin in text and end in text, f"{RESULTS} lacks {script}'s markers"
    return text.split(begin, 1)[1].split(end, 1)[0]


def test_spark_batch_scoring_keeps_up_with_a_plain_parquet_copy():
    """Issue 35: ``dbspec predict --engine spark`` at >= 0.8x a Spark copy's rows/s."""
    row = re.search(r"^\| rows/s, best of \d+ \| [\d,]+ \| [\d,]+ \| (\d+\.\d+)x", 
                    section("batch_vs_spark_udf.py"), re.MULTILINE)
    assert row, "no rows/s row in batch_vs_spark_udf.py's section"
    assert float(row.group(1)) >= 0.8


def test_fine_tuning_keeps_up_with_transformers_and_peft_by_hand():
    """Issue 36: dbspec's LoRA fine-tuning at >= 0.95x the hand-written loop's samples/s."""
    ratio = re.search(r"\*\*wall (\d+\.\d+)x\*\*", section("finetune_vs_hf.py"))
    assert ratio, "no wall ratio in finetune_vs_hf.py's section"
    assert float(ratio.group(1)) >= 0.95

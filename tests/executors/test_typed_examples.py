"""The example specs with typed features (text, images, categorical IDs) run end to end in
smoke mode from a project directory of their own, and what they log takes raw rows: the
served model scores strings and PNG bytes read from the source, the same way the pipeline's
own encoding did."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import ROOT, run_main as run

EXAMPLES = {
    "text_classifier": ("text_classifier_smoke", {"text": "text"}),
    "digits_images": ("digits_images_smoke", {"image": "image"}),
    "mixed_tabular": ("mixed_tabular_smoke", {"user_id": "categorical",
                                              "item_id": "categorical"}),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_typed_example_runs_and_its_model_takes_raw_rows(workdir, name):
    from dbspec.models.served import load_served_model

    model_name, typed = EXAMPLES[name]
    (workdir / "specs").symlink_to(ROOT / "specs")
    code, out, err = run("run", f"specs/{name}.yaml", "--smoke", "--summary-json", "s.json")
    assert code == 0, err
    summary = json.loads((workdir / "s.json").read_text())
    assert summary["model_name"] == model_name
    assert summary["training"]["epochs_run"] == 1
    for feature, kind in typed.items():
        assert f"{feature} ({kind})" in err  # load_data names each feature's type
    (stages,) = (workdir / ".dbspec" / "runs").glob("*-smoke")
    inputs = json.loads((stages / "stages" / "preprocess" / "inputs.json").read_text())
    assert {i["name"]: i["type"] for i in inputs if i["type"] != "numeric"} == typed
    served = load_served_model(stages / "stages" / "train" / "served")
    assert served.card.inputs == inputs  # the fitted vocabularies travel with the model
    import pyarrow.parquet as pq

    raw = pq.read_table(stages / "stages" / "load_data" / "raw.parquet").to_pandas()
    scored = served.predict_frame(raw.head(20))
    # the same rows through the pipeline's encoding give the same predictions
    encoded = np.load(stages / "stages" / "preprocess" / "encoded.npz")["features"][:20]
    assert scored["prediction"].tolist() == served.predict_matrix(encoded)["prediction"].tolist()
    assert "serve" not in summary.get("failed", [])


def test_the_digits_table_holds_png_bytes():
    from deltalake import DeltaTable

    from dbspec.data.shard_writing import record_batches

    dataset = DeltaTable(str(ROOT / "specs" / "data" / "digits_png")).to_pyarrow_dataset()
    # batch by batch on this thread (a threaded scanner can abort the process at exit)
    batches = list(record_batches(dataset, ["image", "label"]))
    assert sum(b.num_rows for b in batches) == 1797
    assert batches[0].column(0)[0].as_py()[:8] == b"\x89PNG\r\n\x1a\n"

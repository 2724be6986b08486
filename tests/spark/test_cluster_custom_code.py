"""Batch scoring on the cluster with a ``model.custom`` network: the user's package exists only
in the driver's project directory (a tmpfs hides it from the workers), so the executors can
rebuild the network only from what dbspec ships them."""

from __future__ import annotations

import pytest

from tests.cluster import worker_sees
from tests.models.test_self_contained import BLOCKS, LAYERS
from tests.spark.test_cluster import _diabetes_parquet, dbspec

pytestmark = pytest.mark.slow

PACKAGE = "dbspec_clusternet_zz"  # not the self-contained test's: both may run in one process
SPEC = f"""\
name: cluster-custom
data: {{source: {{kind: sklearn, name: diabetes}}, task: regression,
       preprocessing: [standard_scale]}}
model: {{custom: {{class: "{PACKAGE}.layers:TinyNet", kwargs: {{hidden: 8}}}}}}
training: {{epochs: 2, batch_size: 64}}
tracking: {{system_metrics: false}}
registry: {{name: cluster_custom}}
"""


def test_a_custom_network_scores_on_executors_that_never_saw_its_module(
        spark_cluster, mlflow_server, tmp_path):
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "layers.py").write_text(LAYERS)
    (package / "blocks.py").write_text(BLOCKS)
    (tmp_path / "spec.yaml").write_text(SPEC)
    assert not worker_sees(spark_cluster, package / "layers.py")
    trained = dbspec("run", "spec.yaml", "-q", cwd=tmp_path, server=mlflow_server)
    assert trained.returncode == 0, trained.stderr[-3000:]
    shared = spark_cluster.shared_dir / "custom-code"
    shared.mkdir()
    rows = _diabetes_parquet(shared / "in.parquet")
    done = dbspec("predict", "models:/cluster_custom/1", "--input", str(shared / "in.parquet"),
                  "--output", str(shared / "out"), "--format", "parquet", "--engine", "spark",
                  "--master", spark_cluster.master, cwd=tmp_path, server=mlflow_server)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wrote {rows:,} rows" in done.stdout
    import pyarrow.dataset as ds

    table = ds.dataset(str(shared / "out"), format="parquet").to_table()
    assert table.num_rows == rows and table.column("prediction").null_count == 0

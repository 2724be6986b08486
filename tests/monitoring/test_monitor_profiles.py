"""Which versions a monitoring pass may leave out: only one the registry confirms has no
reference profile. A registry or artifact store answering errors fails the pass (exit 1),
since a drifted version must not pass unseen because the store was down."""

from __future__ import annotations

import pytest

from tests.registry.conftest import ErroringProxy


def test_a_registry_answering_errors_is_not_a_missing_profile(monkeypatch):
    import mlflow

    from dbspec.monitoring.passes import NoProfile, reference_profile
    from dbspec.registry import RegistryUnavailable

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    proxy = ErroringProxy()  # a tracking server answering 503 to everything
    try:
        with pytest.raises(RegistryUnavailable, match="did not answer") as raised:
            reference_profile(mlflow.MlflowClient(proxy.uri), "m", "1")
        assert not isinstance(raised.value, NoProfile)
    finally:
        proxy.close()


def test_a_version_the_registry_lacks_or_without_a_profile_is_left_out(tmp_path, monkeypatch):
    import mlflow

    from dbspec.monitoring.passes import NoProfile, reference_profile

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client.create_registered_model("m")
    with pytest.raises(NoProfile, match="which the registry does not have"):
        reference_profile(client, "m", "7")
    experiment = client.create_experiment("e", artifact_location=str(tmp_path / "artifacts"))
    run = client.create_run(experiment)
    client.set_terminated(run.info.run_id)
    (tmp_path / "model").mkdir()
    client.create_model_version("m", str(tmp_path / "model"), run_id=run.info.run_id)
    with pytest.raises(NoProfile, match="m v1 has no reference profile"):
        reference_profile(client, "m", "1")


def test_labels_not_arrived_yet_are_left_out_not_a_crash(tmp_path):
    from dbspec.monitoring.labels import read_labels

    path = tmp_path / "labels.csv"
    path.write_text("request_id,target\na,1.5\nb,\nc,3\n")
    labels = read_labels(str(path), "request_id", "target")
    assert labels.keys.to_pylist() == ["a", "c"] and labels.values.tolist() == [1.5, 3.0]
    assert labels.pending == 1

"""MLflow tracking: runs, buffered metrics, artifacts and the logged model."""

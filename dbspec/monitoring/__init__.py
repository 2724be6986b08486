"""Training observability: resource monitoring, TensorBoard event files, bottleneck diagnosis."""

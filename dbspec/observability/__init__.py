"""Training observability: resource sampling, TensorBoard event files, the learning-curve and
bottleneck diagnosis, and the observer that feeds them each epoch."""

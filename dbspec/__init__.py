"""dbspec: one declarative YAML model spec, compiled into real deep-learning runs."""

__version__ = "0.1.0"

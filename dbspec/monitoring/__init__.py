"""Served-model drift: the reference profile, streaming drift statistics, the pass over the
inference table, labels and the report (``dbspec monitor``)."""

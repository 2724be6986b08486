"""A compute plugin whose import fails: it needs a package that is not installed."""

import dbspec_slurm_client  # noqa: F401  (deliberately absent)

KIND = None

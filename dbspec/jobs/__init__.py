"""``dbspec jobs``: Databricks job definitions (bundle or Jobs API JSON) generated from a spec.

- :mod:`.generate`: :func:`generate`, a spec's files for the chosen targets and format.
- :mod:`.build`, :mod:`.resources`, :mod:`.render`: the job, its resources, the files' text.
- :mod:`.files`: which files are dbspec's, ``--check`` (:class:`JobsCheck`) and writing.
- :mod:`.command`: :func:`run_jobs`, the command itself.
"""

from dbspec.jobs.command import run_jobs
from dbspec.jobs.files import Difference, JobsCheck
from dbspec.jobs.generate import FORMATS, generate

__all__ = ["FORMATS", "Difference", "JobsCheck", "generate", "run_jobs"]

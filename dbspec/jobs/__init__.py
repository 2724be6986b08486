"""``dbspec jobs``: Databricks job definitions (bundle or Jobs API JSON) generated from a spec.

:mod:`.generate` builds a spec's files; :mod:`.build`, :mod:`.resources`, :mod:`.monitor` and
:mod:`.render` make the jobs, their resources and the files' text; :mod:`.files` owns
``--check`` and writing; :mod:`.command` is the command.
"""

from dbspec.jobs.command import run_jobs
from dbspec.jobs.files import Difference, JobsCheck
from dbspec.jobs.generate import FORMATS, generate

__all__ = ["FORMATS", "Difference", "JobsCheck", "generate", "run_jobs"]

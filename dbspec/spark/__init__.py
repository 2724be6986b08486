"""Spark for dbspec: the session it starts and stops (:mod:`.session`), where training ranks
run (:mod:`.placement`) and what an executor can see (:mod:`.probe`)."""

from dbspec.spark.session import (
    QUIET_LOG4J,
    VERBOSE_ENV,
    executor_python,
    master_url,
    python_cause,
    quiet_java_options,
    quiet_pyspark_warnings,
    spark_session,
    verbose,
)

__all__ = ["QUIET_LOG4J", "VERBOSE_ENV", "executor_python", "master_url", "python_cause",
           "quiet_java_options", "quiet_pyspark_warnings", "spark_session", "verbose"]

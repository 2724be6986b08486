"""How close does ``dbspec predict --engine spark`` come to a plain Spark copy of its input, and
how much faster is it than ``mlflow.pyfunc.spark_udf``?

Trains and registers ``specs/diabetes.yaml`` in a fresh temporary directory (its own SQLite
MLflow store), then writes a ``--rows``-row Parquet input (default 1,000,000): the model's 10
feature columns (age, sex, bmi, bp, s1..s6; float64, scaled as sklearn ships them; real diabetes
rows resampled with small Gaussian noise, fixed seed) and an integer ``id``.

Every job runs on local Spark, reads the same Parquet input and writes Parquet (overwrite):

- copy (the goal's yardstick): ``read.parquet(input).write.parquet(output)``, no scoring, at
  Spark's defaults, as a user's plain copy runs;
- copy at dbspec's batch size: the same with ``spark.sql.parquet.columnarReaderBatchSize`` set
  as ``predict_spark`` sets it for its own job (for context: how much of dbspec's speed is the
  bigger read batch);
- noop (for context): the same read written to Spark's ``noop`` format;
- dbspec: ``dbspec.serving.batch.predict_spark(spark, loaded, input, output, fmt="parquet")``
  with the model loaded by ``dbspec.serving.source.load_version``, as ``dbspec predict --engine
  spark`` calls it: the input columns, the prediction, ``out_of_range``, ``model_name`` and
  ``model_version``, with its commit (staging directory swapped into place) and the count of
  the written rows; all of it timed, since the user waits for it;
- mlflow: ``mlflow.pyfunc.spark_udf(spark, "models:/NAME/1", result_type="double",
  env_manager="local")`` (made once, untimed), then ``read.parquet(input).withColumn(
  "prediction", udf(*features)).write.mode("overwrite").parquet(output)``;
- for context, not for the goal: ``predict_local`` (``dbspec predict --engine local``: Arrow
  record batches, no Spark) in the dbspec side's process.

Each side runs in its own Python process and SparkSession, with the same settings (``local[2]``,
UI off, 2 shuffle partitions): ``spark_udf`` puts the copy of dbspec logged with the model first
on ``sys.path`` of the Python workers it runs in, and Spark reuses those workers, so a dbspec UDF
run later in the same SparkContext would import the wrong dbspec. The copies run in a third.
The processes stay up and the parent has them run one job at a time: first one untimed warm-up
run of each job (Python workers start, imports, JIT), then ``--repeats`` rounds of one timed run
of each job, interleaved (dbspec and mlflow alternate which goes first), so that load from other
work on the machine falls on all of them alike. Reported: best and median rows/s (wall clock),
and the median CPU seconds of each side's processes (Python driver, JVM, Python workers): a
second view, less disturbed by other work than the wall clock, though not immune to it.
Afterwards both outputs must hold every row with the input's values, and the predictions of a
random sample of ids must agree within 1e-4 (relative); a mismatch or an error exits non-zero.

Goal (issue 16): dbspec >= 0.8x the copy's rows/s (scoring costs at most 25% over the copy),
best against best (the medians are shown too); the ratio to spark_udf is printed as well. A
missed goal is a measurement, not an error: the exit status stays 0. Other work on the machine
skews the figures; the load average is printed at the start and the end.
Run: ``python benchmarks/batch_vs_spark_udf.py [--rows 1000000] [--repeats 3] [--keep]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import _serving_setup as setup
from _results import write_section

MASTER = "local[2]"
SPARK_CONF = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
              "spark.sql.shuffle.partitions": "2"}
ARROW_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"
TARGET_RATIO = 0.8  # of the copy's rows/s
TOLERANCE = 1e-4  # relative
SAMPLE = 2_000  # ids whose predictions are compared
NOISE = 0.05  # Gaussian noise, as a fraction of each feature's standard deviation
ROW_GROUP = 65_536  # several row groups, so that Spark splits the file between its cores
SIDES = ("floor", "dbspec", "mlflow")


def load_text() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} cores"


def write_input(path: Path, rows: int, seed: int = 0) -> list[str]:
    """``rows`` resampled diabetes rows with noise and an ``id`` column; the feature names."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    names, real = setup.diabetes_rows(442)  # the whole data set
    real = np.asarray(real, dtype=np.float64)
    rng = np.random.default_rng(seed)
    values = real[rng.integers(0, len(real), rows)]
    values += rng.normal(0.0, 1.0, values.shape) * (NOISE * real.std(axis=0))
    columns = {"id": pa.array(np.arange(rows, dtype=np.int64))}
    columns.update({name: pa.array(values[:, j]) for j, name in enumerate(names)})
    pq.write_table(pa.table(columns), path, row_group_size=ROW_GROUP)
    return names


# -- one side, in its own process -----------------------------------------------------------

def spark_session(side: str):
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(MASTER).appName(f"batch-bench-{side}")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def side_jobs(args: argparse.Namespace, spark, info: dict) -> dict[str, Callable[[], None]]:
    """The jobs one side runs on its session, by name; set-up facts go into ``info``."""
    source, output = args.input, args.output
    if args.side == "floor":
        info["partitions"] = spark.read.parquet(source).rdd.getNumPartitions()

        def noop() -> None:
            spark.read.parquet(source).write.format("noop").mode("overwrite").save()

        def copy() -> None:
            spark.read.parquet(source).write.mode("overwrite").parquet(output)

        def copy_batched() -> None:  # with the reader batch predict_spark sets for itself
            from dbspec.serving.batch_spark import arrow_batch_rows

            key = "spark.sql.parquet.columnarReaderBatchSize"
            spark.conf.set(key, str(arrow_batch_rows(spark.read.parquet(source).schema)))
            try:
                copy()
            finally:
                spark.conf.unset(key)

        return {"noop": noop, "copy": copy, "copy_batched": copy_batched}
    if args.side == "dbspec":
        import mlflow

        from dbspec.serving.batch import predict_local, predict_spark
        from dbspec.serving.source import ModelTarget, load_version

        from dbspec.serving.batch_spark import arrow_batch_rows

        started = time.perf_counter()
        client = mlflow.MlflowClient(tracking_uri=args.tracking_uri)
        loaded = load_version(client, ModelTarget(args.name, version=args.version), args.version)
        info["model_s"] = time.perf_counter() - started
        info["batch_rows"] = arrow_batch_rows(spark.read.parquet(source).schema)

        def predict() -> None:
            result = predict_spark(spark, loaded, source, output, fmt="parquet")
            if result.rows != args.rows:
                raise SystemExit(f"predict_spark reported {result.rows:,} rows, not {args.rows:,}")

        def through_udf() -> None:  # before issue 35: every input through the Arrow UDF
            from unittest import mock

            with mock.patch("dbspec.serving.batch_spark._file_slices", lambda *args: None):
                result = predict_spark(spark, loaded, source, output + "_udf", fmt="parquet")
            if result.rows != args.rows:
                raise SystemExit(f"predict_spark reported {result.rows:,} rows, not {args.rows:,}")

        def local() -> None:  # for context: the same job with --engine local, no Spark
            result = predict_local(loaded, source, output + "_local", fmt="parquet")
            if result.rows != args.rows:
                raise SystemExit(f"predict_local reported {result.rows:,} rows, not {args.rows:,}")

        return {"score": predict, "score_udf": through_udf, "local": local}
    import mlflow
    from pyspark.sql import functions as F

    mlflow.set_tracking_uri(args.tracking_uri)
    started = time.perf_counter()
    udf = mlflow.pyfunc.spark_udf(spark, f"models:/{args.name}/{args.version}",
                                  result_type="double", env_manager="local")
    info["model_s"] = time.perf_counter() - started
    features = [F.col(name) for name in args.features.split(",")]

    def score() -> None:
        spark.read.parquet(source).withColumn("prediction", udf(*features)) \
            .write.mode("overwrite").parquet(output)

    return {"score": score}


def tree_cpu() -> float:
    """CPU seconds (user + system) of this process and all its descendants so far: the Spark
    driver's JVM, and the Python workers it starts."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for process in [me] + me.children(recursive=True):
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def run_side(args: argparse.Namespace) -> None:
    """Serve the parent: run each job named on stdin, answer its wall-clock and CPU seconds on
    ``--reply-fd``."""
    replies = os.fdopen(int(args.reply_fd), "w", buffering=1)
    spark = spark_session(args.side)
    info: dict = {"arrow_batch": spark.conf.get(ARROW_BATCH, None)}
    jobs = side_jobs(args, spark, info)
    replies.write(json.dumps(info) + "\n")
    for line in sys.stdin:
        name = line.strip()
        if name == "quit":
            break
        cpu, started = tree_cpu(), time.perf_counter()
        jobs[name]()
        replies.write(json.dumps({"seconds": time.perf_counter() - started,
                                  "cpu": tree_cpu() - cpu}) + "\n")
    replies.write(json.dumps({"arrow_batch": spark.conf.get(ARROW_BATCH, None)}) + "\n")
    spark.stop()


class Side:
    """One side's child process: its own Python, Spark driver and session; jobs on demand."""

    def __init__(self, side: str, args: argparse.Namespace, trained: setup.Trained,
                 workdir: Path, features: list[str]):
        self.side, self.log = side, workdir / f"{side}.log"
        env = setup.base_env()
        env.update(MLFLOW_TRACKING_URI=trained.tracking_uri, PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable)
        read, write = os.pipe()
        command = [sys.executable, str(Path(__file__).resolve()), "--side", side,
                   "--rows", str(args.rows), "--input", str(workdir / "input.parquet"),
                   "--output", str(workdir / f"out-{side}"), "--reply-fd", str(write),
                   "--tracking-uri", trained.tracking_uri, "--name", trained.name,
                   "--version", trained.version, "--features", ",".join(features)]
        self._log_file = open(self.log, "wb")
        self.process = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.PIPE,
                                        stdout=self._log_file, stderr=subprocess.STDOUT,
                                        pass_fds=(write,), text=True)
        os.close(write)
        self._replies = os.fdopen(read)
        started = time.perf_counter()
        self.info = self._reply("start its Spark session")
        print(f"  {side}: Spark session and set-up in {time.perf_counter() - started:.1f} s "
              f"(log {self.log})", flush=True)

    def _reply(self, doing: str) -> dict:
        line = self._replies.readline()
        if not line:
            self.process.wait()
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])
            raise SystemExit(f"the {self.side} side failed to {doing} (exit "
                             f"{self.process.returncode}); the end of {self.log}:\n{tail}")
        return json.loads(line)

    def run(self, job: str) -> dict:
        """``seconds`` (wall clock) and ``cpu`` seconds ``job`` took, end to end, in the child."""
        try:
            self.process.stdin.write(job + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:  # it died: _reply says how
            pass
        return self._reply(f"run {job}")

    def close(self) -> dict:
        """Stop the child (its session first); its last report, if it got that far."""
        last: dict = {}
        try:
            if self.process.poll() is None:
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
                last = self._reply("stop")
                self.process.wait(120)
        except (OSError, SystemExit, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        finally:
            self._replies.close()
            self._log_file.close()
        return last


# -- the parent: set-up, checks, report -----------------------------------------------------

def check_outputs(workdir: Path, rows: int, features: list[str], trained: setup.Trained) -> str:
    """Both outputs hold every row with the input's values, and agree on a sample of ids."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    inputs = ["id"] + features
    expected = {"dbspec": set(inputs) | {"prediction", "out_of_range", "model_name",
                                         "model_version"},
                "mlflow": set(inputs) | {"prediction"}}
    rng = np.random.default_rng(1)
    ids = np.unique(np.concatenate([[0, rows - 1], rng.integers(0, rows, SAMPLE)]))
    wanted = ds.field("id").isin(ids.tolist())

    def sample(path: Path, columns: list[str]):
        table = ds.dataset(str(path), format="parquet").to_table(columns=columns, filter=wanted)
        return table.sort_by("id")

    source = sample(workdir / "input.parquet", inputs)
    outputs = {}
    for side, columns in expected.items():
        dataset = ds.dataset(str(workdir / f"out-{side}"), format="parquet")
        names = set(dataset.schema.names)
        if names != columns:
            raise SystemExit(f"the {side} output has columns {sorted(names)}, expected "
                             f"{sorted(columns)}")
        if dataset.count_rows() != rows:
            raise SystemExit(f"the {side} output has {dataset.count_rows():,} rows, not {rows:,}")
        table = sample(workdir / f"out-{side}", sorted(columns))
        if table.num_rows != len(ids) or not table.select(inputs).equals(source):
            raise SystemExit(f"the {side} output's sampled rows differ from the input's "
                             f"(ids, feature values)")
        outputs[side] = table
    ours = outputs["dbspec"]["prediction"].to_numpy()
    theirs = outputs["mlflow"]["prediction"].to_numpy()
    error = np.abs(ours - theirs) / np.maximum(1.0, np.abs(theirs))
    if not np.isfinite(ours).all() or not np.isfinite(theirs).all() or error.max() > TOLERANCE:
        worst = int(np.nanargmax(np.where(np.isfinite(error), error, np.inf)))
        raise SystemExit(f"the predictions disagree: id {ids[worst]}: dbspec "
                         f"{float(ours[worst])!r}, mlflow {float(theirs[worst])!r} (max relative "
                         f"error {np.nanmax(error):.2e}, tolerance {TOLERANCE:g})")
    labels = pc.unique(pc.binary_join_element_wise(outputs["dbspec"]["model_name"],
                                                   outputs["dbspec"]["model_version"], "/"))
    if labels.to_pylist() != [f"{trained.name}/{trained.version}"]:
        raise SystemExit(f"dbspec's model_name/model_version columns hold {labels.to_pylist()}")
    return (f"outputs checked: {rows:,} rows each, columns as expected, {len(ids):,} sampled ids "
            f"identical to the input; predictions agree (max relative difference "
            f"{error.max():.1e}, tolerance {TOLERANCE:g})")


def write_results(args: argparse.Namespace, rates: dict, cpu: dict, start: str,
                  end: str) -> None:
    """Replace this script's section of RESULTS.md (between its markers) with these figures."""
    import pyspark

    copy, ours = rates[("floor", "copy")], rates[("dbspec", "score")]
    udf, theirs = rates[("dbspec", "score_udf")], rates[("mlflow", "score")]
    ratio = ours[0] / copy[0]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        "## Spark batch scoring: `dbspec predict --engine spark` against a plain Parquet copy",
        "",
        f"**Conditions.** {when}, load average {start} at the start, {end} at the end. "
        f"`batch_vs_spark_udf.py --repeats {args.repeats} --results`, {args.rows:,} rows x 10 "
        f"features, `{MASTER}`; pyspark {pyspark.__version__}. All jobs ran interleaved in one "
        "run. A plain Parquet input is scored by Spark tasks that read, score and write it with "
        "pyarrow (`dbspec/serving/batch_spark_files.py`); the Arrow UDF row is the same job "
        "with every input sent through Spark's reader, the UDF and Spark's writer, as before "
        "issue 35 (tables, Delta, CSV and partitioned inputs still are).",
        "",
        "| measure | copy | dbspec | ratio | goal (issue 35) |",
        "| --- | --- | --- | --- | --- |",
        f"| rows/s, best of {args.repeats} | {copy[0]:,.0f} | {ours[0]:,.0f} | {ratio:.2f}x "
        f"(median {ours[1] / copy[1]:.2f}x) | >= {TARGET_RATIO:g}x: "
        f"{'met' if ratio >= TARGET_RATIO else '**not met**'} |",
        f"| CPU seconds, median, all processes | {cpu[('floor', 'copy')]:.2f} | "
        f"{cpu[('dbspec', 'score')]:.2f} | "
        f"{cpu[('dbspec', 'score')] / cpu[('floor', 'copy')]:.2f}x | - |",
        f"| the Arrow UDF path, rows/s, best of {args.repeats} | {copy[0]:,.0f} | "
        f"{udf[0]:,.0f} | {udf[0] / copy[0]:.2f}x (CPU "
        f"{cpu[('dbspec', 'score_udf')] / cpu[('floor', 'copy')]:.2f}x) | - |",
        f"| against `spark_udf`, rows/s, best of {args.repeats} | {theirs[0]:,.0f} (spark_udf) "
        f"| {ours[0]:,.0f} | {ours[0] / theirs[0]:.2f}x spark_udf's | - |",
    ]
    write_section("batch_vs_spark_udf.py", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000,
                        help="rows in the Parquet input (default 1,000,000)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs per side, after one untimed warm-up run (default 3)")
    parser.add_argument("--spec", default=str(setup.DIABETES_SPEC))
    parser.add_argument("--results", action="store_true",
                        help="replace this script's section of RESULTS.md with the figures")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (store, input, outputs, Spark logs)")
    for internal in ("--side", "--input", "--output", "--reply-fd", "--tracking-uri", "--name",
                     "--version", "--features"):  # a child process's orders
        parser.add_argument(internal, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rows < 2 or args.repeats < 1:
        raise SystemExit("--rows must be >= 2 and --repeats >= 1")
    if args.side:
        if args.side not in SIDES:
            raise SystemExit(f"--side must be one of {', '.join(SIDES)}")
        run_side(args)
        return

    start_load = load_text()
    print(f"load average at the start {start_load}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="dbspec-batch-bench-"))
    sides: dict[str, Side] = {}
    timings: dict[tuple[str, str], dict] = {}
    try:
        trained = setup.train(Path(args.spec).resolve(), workdir)
        started = time.perf_counter()
        features = write_input(workdir / "input.parquet", args.rows)
        size = (workdir / "input.parquet").stat().st_size
        print(f"wrote the input: {args.rows:,} rows x {len(features)} float64 features + id, "
              f"{size / 2**20:.0f} MiB, row groups of {ROW_GROUP:,} rows, in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
        print(f"Spark {MASTER}, {', '.join(f'{k}={v}' for k, v in SPARK_CONF.items())}; one "
              f"process and session per side, all kept up; 1 warm-up + {args.repeats} timed "
              "runs per job, in rounds", flush=True)
        for side in SIDES:
            sides[side] = Side(side, args, trained, workdir, features)
        jobs = [("floor", "noop"), ("floor", "copy_batched"), ("dbspec", "local"),
                ("dbspec", "score_udf"), ("floor", "copy"), ("dbspec", "score"),
                ("mlflow", "score")]
        timings = {job: {"warmup": 0.0, "seconds": [], "cpu": []} for job in jobs}
        for job in jobs:
            timings[job]["warmup"] = sides[job[0]].run(job[1])["seconds"]
        print("  warm-up: " + ", ".join(f"{side} {name} {timings[(side, name)]['warmup']:.1f} s"
                                       for side, name in jobs), flush=True)
        for round_ in range(args.repeats):
            # the copy, dbspec and mlflow run back to back, in turn first and last
            order = jobs if round_ % 2 == 0 else jobs[:3] + jobs[:3:-1] + jobs[3:4]
            for side, name in order:
                took = sides[side].run(name)
                timings[(side, name)]["seconds"].append(took["seconds"])
                timings[(side, name)]["cpu"].append(took["cpu"])
            print(f"  round {round_ + 1}: " + ", ".join(
                f"{side} {name} {timings[(side, name)]['seconds'][-1]:.2f} s"
                for side, name in order) + f"; load {os.getloadavg()[0]:.2f}", flush=True)
        info = {side: sides[side].info for side in SIDES}
        for side in SIDES:
            sides.pop(side).close()
        checked = check_outputs(workdir, args.rows, features, trained)
    finally:
        for side in sides.values():
            side.close()
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report(args, timings, info, checked, start_load)


def report(args: argparse.Namespace, timings: dict, info: dict, checked: str,
           start_load: str) -> None:
    """Print the figures (the goal's ratio last); with ``--results``, write them too."""
    print(f"load average at the end {load_text()} (other work skews the figures)")
    print(checked)
    print(f"input: {info['floor']['partitions']} Spark partitions; {ARROW_BATCH}: "
          f"{info['mlflow']['arrow_batch'] or 'unset (Spark default, 10000)'} for spark_udf "
          f"(Parquet reader batches of 4,096 rows, Spark's default); predict_spark sets "
          f"{info['dbspec']['batch_rows']:,}-row Arrow and reader batches for its own job")
    print(f"model set-up (untimed): dbspec load_version {info['dbspec']['model_s']:.1f} s, "
          f"mlflow spark_udf {info['mlflow']['model_s']:.1f} s")
    print()
    labels = {("floor", "noop"): "Spark read -> noop",
              ("floor", "copy"): "Parquet copy (yardstick)",
              ("floor", "copy_batched"): "copy, dbspec's read batch",
              ("mlflow", "score"): "mlflow spark_udf",
              ("dbspec", "score_udf"): "predict_spark, Arrow UDF",
              ("dbspec", "score"): "dbspec predict_spark",
              ("dbspec", "local"): "dbspec predict_local"}
    print(f"{'job (read, score, write)':<28} {'warm-up s':>9} {'runs s':>22} {'best rows/s':>12} "
          f"{'median rows/s':>14} {'CPU s, median':>14}")
    rates, cpu = {}, {}
    for job, label in labels.items():
        seconds = timings[job]["seconds"]
        best, median = args.rows / min(seconds), args.rows / statistics.median(seconds)
        rates[job], cpu[job] = (best, median), statistics.median(timings[job]["cpu"])
        print(f"{label:<28} {timings[job]['warmup']:>9.2f} "
              f"{' '.join(f'{s:.2f}' for s in seconds):>22} {best:>12,.0f} {median:>14,.0f} "
              f"{cpu[job]:>14.2f}")
    ours, copy, theirs = rates[("dbspec", "score")], rates[("floor", "copy")], \
        rates[("mlflow", "score")]
    print()
    batched = rates[("floor", "copy_batched")][0] / copy[0]
    print(f"for context: dbspec predict --engine local / spark_udf rows/s "
          f"{rates[('dbspec', 'local')][0] / theirs[0]:.2f}x best vs best (one process, no "
          f"Spark); copy at dbspec's read batch / copy {batched:.2f}x")
    print(f"CPU seconds (medians, all processes of a side): dbspec / copy "
          f"{cpu[('dbspec', 'score')] / cpu[('floor', 'copy')]:.2f}x, spark_udf / dbspec "
          f"{cpu[('mlflow', 'score')] / cpu[('dbspec', 'score')]:.2f}x")
    udf = rates[("dbspec", "score_udf")]
    print(f"before issue 35 (every input through the Arrow UDF) / copy rows/s: "
          f"{udf[0] / copy[0]:.2f}x best vs best; CPU "
          f"{cpu[('dbspec', 'score_udf')] / cpu[('floor', 'copy')]:.2f}x the copy's")
    if args.results:
        write_results(args, rates, cpu, start_load, load_text())
    print(f"dbspec / spark_udf rows/s: {ours[0] / theirs[0]:.2f}x best vs best, "
          f"{ours[1] / theirs[1]:.2f}x median vs median")
    ratio = ours[0] / copy[0]
    print(f"dbspec / copy rows/s: {ratio:.2f}x best vs best, {ours[1] / copy[1]:.2f}x median vs "
          f"median; goal >= {TARGET_RATIO:g}x (best vs best): "
          f"{'PASS' if ratio >= TARGET_RATIO else 'FAIL'}")


if __name__ == "__main__":
    sys.exit(main())

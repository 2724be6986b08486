"""What does it cost to launch a DDP run on a Spark cluster, and how much of that is dbspec's?

One small DDP spec (the diabetes MLP 10-16-1, batch 32, ``compute.kind: torch_distributor``,
``use_gpu: false``, no registry) is run as a separate ``python -m dbspec run`` process, as a
user would, against one ``mlflow server`` and one 2-worker Spark standalone cluster
(``tests/cluster.py``: 1-core workers in their own mount namespace, the driver's project and
the tracking server's store hidden from them under an empty tmpfs). Configurations:

1. ``--master spark://...`` (the cluster), ``local_mode: false``, 2 ranks (on the executors)
2. the cluster, ``local_mode: false``, 1 rank
3. the cluster, ``local_mode: true``, 2 ranks (torchrun on the driver)
4. ``--master local[2]``, ``local_mode: false``, 2 ranks (barrier tasks of the local JVM)
5. ``--master local[2]``, ``local_mode: true``, 2 ranks

and a bare peer: in this process, a SparkSession on the same cluster master and
``TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(rank_main, work_dir)``
on the job configuration (1) ran (its ``job.json``, metrics to a fresh MLflow run, its own
checkpoint dir), with the shards rebuilt by dbspec's own code from (1)'s recorded stage outputs
(``fit_spec`` up to the point where it calls ``launch``). The final weights of the bare run are
compared with (1)'s: equal checksums mean the same work was done. Before the timed call the
executors get the same warm-up dbspec gives them (its executor probe, outside the train stage).

Reported per configuration (median over ``--repeats``): time to first epoch (train stage start,
the ``> train`` progress line, to rank 0's ``train_loss`` at step 0 on the server: rank 0 logs
its real time), train-stage seconds (``state.json``), the ranks' own training-loop seconds and
process wall time; then where the time goes, from timestamps the run leaves behind (progress
lines as they arrive, the MLflow run's start/end, metric timestamps, the logged model's creation
time, the mtimes of ``job.json`` and ``result.json``), and the ratios 2 ranks / 1 rank, cluster
/ ``local[2]`` and dbspec's train stage / the bare ``TorchDistributor.run``.

One machine cannot show a speed-up (both "nodes" share its cores); what it shows is the launch
overhead. Needs root (``unshare -m`` and ``mount``), Java, and minutes: each cluster run pays
Spark's executor start and the distributor's launch. Close other work first.
Run: ``python benchmarks/cluster_overhead.py [--epochs 20] [--repeats 2] [--quick] [--keep]``
(the configurations alternate in order between repeats; the ratios come last).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NAME = "cluster-overhead"
SPEC = """\
name: %(name)s
data:
  source: {kind: sklearn, name: diabetes}
  task: regression
  preprocessing: [standard_scale]
model:
  layers:
    - linear: {out: 16}
    - relu
    - linear: {out: 1}
training:
  optimizer: {name: adam, lr: 0.01}
  epochs: %(epochs)d
  batch_size: 32
compute: {kind: torch_distributor, num_processes: %(ranks)d, use_gpu: false,
          local_mode: %(local_mode)s}
"""


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    cluster: bool  # the standalone cluster's master, else local[2]
    ranks: int
    local_mode: bool


CONFIGS = (
    Config("cluster-2", "(1) cluster, local_mode false", True, 2, False),
    Config("cluster-1", "(2) cluster, local_mode false", True, 1, False),
    Config("cluster-lm", "(3) cluster, local_mode true", True, 2, True),
    Config("local2-2", "(4) local[2], local_mode false", False, 2, False),
    Config("local2-lm", "(5) local[2], local_mode true", False, 2, True),
)
QUICK = ("cluster-2", "local2-2")
BARE = "bare TorchDistributor.run"  # on the job of (1)

#: where the time goes, in order: (key, words); each is the span from the previous mark
SEGMENTS = (
    ("to_session", "process start -> '> spark session' line"),
    ("session_probe", "Spark session + executor probe"),
    ("data_stages", "load_data, split, preprocess"),
    ("to_run", "train: stage start -> MLflow run started"),
    ("to_job", "train: run -> job.json written (tensors, shards)"),
    ("to_first", "train: job.json -> rank 0's first epoch"),
    ("epochs", "train: epochs 2..N"),
    ("to_result", "train: last epoch -> ranks' result.json"),
    ("to_return", "train: result.json -> launch returned"),
    ("to_model", "train: tensorboard, params, dataset, served dir"),
    ("log_model", "train: mlflow.pyfunc.log_model"),
    ("to_end", "train: last metrics, run end -> stage done"),
    ("after", "evaluate stage, summary, exit"),
)
_CHILDREN: set[subprocess.Popen] = set()


@dataclass
class Result:
    key: str
    ranks: int
    ok: bool = False
    error: str = ""
    wall: Optional[float] = None
    stage: Optional[float] = None
    first_epoch: Optional[float] = None
    rank_seconds: Optional[float] = None
    distributor: Optional[float] = None  # job.json written -> launch returned
    checksum: Optional[float] = None
    segments: dict[str, float] = field(default_factory=dict)
    job_dir: Optional[Path] = None
    project: Optional[Path] = None
    log: Optional[Path] = None


# -- running dbspec -------------------------------------------------------------------------

def run_logged(command: list[str], *, cwd: Path, env: dict, log: Path,
               timeout: float) -> tuple[int, float, float, list[tuple[float, str]]]:
    """Run ``command`` in its own session; every output line is kept with the time it arrived.

    Returns (exit status, start time, wall seconds, [(time, line)]); status -9 after a timeout.
    """
    lines: list[tuple[float, str]] = []
    lock = threading.Lock()
    handle = log.open("w")
    started = time.time()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    _CHILDREN.add(process)

    def pump(stream, tag: str) -> None:
        for raw in iter(stream.readline, b""):
            now = time.time()
            text = raw.decode("utf-8", "replace").rstrip("\n")
            with lock:
                lines.append((now, text))
                handle.write(f"{now - started:8.2f} {tag} {text}\n")
                handle.flush()

    threads = [threading.Thread(target=pump, args=(process.stdout, "out"), daemon=True),
               threading.Thread(target=pump, args=(process.stderr, "err"), daemon=True)]
    for thread in threads:
        thread.start()
    try:
        status = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(process)
        status = -9
    wall = time.time() - started
    for thread in threads:
        thread.join(timeout=10)
    _CHILDREN.discard(process)
    handle.close()
    return status, started, wall, sorted(lines)


def _kill(process: subprocess.Popen) -> None:
    """SIGKILL the child's whole session (its JVM, its torchrun ranks)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def dbspec_env(server_uri: str) -> dict:
    env = {**os.environ, "MLFLOW_TRACKING_URI": server_uri}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for name in ("DBSPEC_SHARED_DIR", "PYSPARK_PYTHON", "SPARK_MASTER"):
        env.pop(name, None)
    return env


def run_config(config: Config, repeat: int, *, epochs: int, cluster, server, hidden: Path,
               logs: Path, timeout: float) -> Result:
    """One ``dbspec run`` of ``config`` in a fresh project; its timings from what it left."""
    result = Result(config.key, config.ranks)
    project = hidden / f"{config.key}-r{repeat}"
    project.mkdir()
    (project / "spec.yaml").write_text(SPEC % {
        "name": NAME, "epochs": epochs, "ranks": config.ranks,
        "local_mode": str(config.local_mode).lower()})
    master = cluster.master if config.cluster else "local[2]"
    command = [sys.executable, "-m", "dbspec", "run", "spec.yaml", "--master", master]
    shared = None
    if config.cluster and not config.local_mode:
        shared = cluster.shared_dir / f"{config.key}-r{repeat}"
        command += ["--shared-dir", str(shared)]
    result.project, result.log = project, logs / f"{config.key}-r{repeat}.log"
    print(f"  [{time.strftime('%H:%M:%S')}] {config.key} (repeat {repeat + 1}): "
          f"dbspec run --master {master}{' --shared-dir ...' if shared else ''}",
          file=sys.stderr, flush=True)
    status, started, wall, lines = run_logged(command, cwd=project, env=dbspec_env(server.uri),
                                              log=result.log, timeout=timeout)
    result.wall = wall
    if status != 0:
        tail = [text for _, text in lines[-15:] if text.strip()]
        result.error = ("timed out" if status == -9 else f"exit {status}") + \
            f": {tail[-1].strip()[:200] if tail else 'no output'} (log {result.log})\n" + \
            "\n".join(tail)
        return result
    try:
        _timings(result, lines, started, wall, server=server, shared=shared)
    except Exception as exc:  # a run that worked but left a mark out: say which
        result.ok = False
        result.error = f"cannot read its timings: {type(exc).__name__}: {exc} (log {result.log})"
    return result


def _timings(result: Result, lines, started: float, wall: float, *, server,
             shared: Optional[Path]) -> None:
    from mlflow import MlflowClient

    project = result.project
    run_dir = project / ".dbspec" / "runs" / NAME
    state = json.loads((run_dir / "state.json").read_text())
    train = state["stages"]["train"]
    result.stage = train["seconds"]
    output = train["output"]
    job_dir = (shared / "runs" / NAME / "train" / "distributed") if shared else \
        run_dir / "stages" / "train" / "distributed"
    result.job_dir = job_dir
    ranks = [json.loads(p.read_text()) for p in sorted(job_dir.glob("rank-*.json"))]
    if ranks:
        result.rank_seconds = max(r["seconds"] for r in ranks)
        result.checksum = next((r["checksum"] for r in ranks if r["rank"] == 0), None)
    client = MlflowClient(tracking_uri=server.uri)
    run = client.get_run(output["run_id"])

    def metric_times(name: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.timestamp / 1000) for m in
                      client.get_metric_history(output["run_id"], name))

    losses = metric_times("train_loss")
    returned = metric_times("rank_0_samples_per_second")
    summary = metric_times("train_samples_per_second")
    model_id = output["model_uri"].split("models:/", 1)[-1]
    model_created = client.get_logged_model(model_id).creation_timestamp / 1000

    def line_time(predicate) -> Optional[float]:
        return next((t for t, text in lines if predicate(text)), None)

    stage_start = line_time(lambda text: text.strip() == "> train")
    stage_done = line_time(lambda text: text.strip().startswith("train done in"))
    if stage_start is None:  # no progress lines: the MLflow run's start is the nearest mark
        stage_start = run.info.start_time / 1000
    if stage_done is None:
        stage_done = stage_start + result.stage
    first_epoch = next(t for step, t in losses if step == 0)
    result.first_epoch = first_epoch - stage_start
    result.ok = True
    marks = {
        "start": started,
        "to_session": line_time(lambda text: text.startswith("> spark session on")),
        "session_probe": line_time(lambda text: text.strip() == "> load_data"),
        "data_stages": stage_start,
        "to_run": run.info.start_time / 1000,
        "to_job": (job_dir / "job.json").stat().st_mtime,
        "to_first": first_epoch,
        "epochs": losses[-1][1],
        "to_result": (job_dir / "result.json").stat().st_mtime,
        "to_return": returned[0][1] if returned else None,
        "to_model": model_created,
        "log_model": summary[0][1] if summary else None,
        "to_end": stage_done,
        "after": started + wall,
    }
    result.segments = _spans(marks)
    if marks["to_job"] and marks["to_return"]:
        result.distributor = marks["to_return"] - marks["to_job"]


def _spans(marks: dict[str, Optional[float]]) -> dict[str, float]:
    """Each mark minus the previous known one (a missing mark folds into the next span)."""
    spans, previous = {}, None
    for key, value in marks.items():
        if value is None:
            continue
        if previous is not None:
            spans[key] = value - previous
        previous = value
    return spans


# -- the bare peer ----------------------------------------------------------------------------

def rebuilt_tensors(project: Path):
    """The tensors the train stage of ``project`` handed to ``launch``, rebuilt by dbspec's
    own code (``fit_spec`` on the recorded stage outputs, stopped where it calls launch)."""
    import dbspec.training.distributed as distributed
    from dbspec.data import store
    from dbspec.spec.loader import load_spec
    from dbspec.training.fit import FitOptions, fit_spec

    run_dir = project / ".dbspec" / "runs" / NAME
    state = json.loads((run_dir / "state.json").read_text())
    stages = run_dir / "stages"
    spec = load_spec(str(project / "spec.yaml")).spec
    table = store.read_table(stages / "load_data", state["stages"]["load_data"]["output"])
    splits = store.read_splits(stages / "split")
    fitted = store.read_preprocessing(stages / "preprocess")
    captured = {}

    class Captured(Exception):
        pass

    def capture(spec, tensors, card, **_):
        captured["tensors"] = tensors
        raise Captured

    original, distributed.launch = distributed.launch, capture
    try:
        with tempfile.TemporaryDirectory() as tmp:
            fit_spec(spec, table, splits, fitted, FitOptions(work_dir=Path(tmp)))
    except Captured:
        pass
    finally:
        distributed.launch = original
    return captured["tensors"]


@contextlib.contextmanager
def _fd2_to(log) -> None:
    """Point file descriptor 2 at ``log`` for the block (the JVM started in it keeps it)."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def bare_peer(source: Result, repeat: int, *, cluster, server, log) -> Result:
    """``TorchDistributor(2, local_mode=False).run(rank_main, work_dir)`` on (1)'s job."""
    import logging

    from mlflow import MlflowClient
    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import SparkSession

    from dbspec.spark.probe import probe_executors
    from dbspec.training.distributed import _write_shards, rank_main

    result = Result(BARE, 2)
    print(f"  [{time.strftime('%H:%M:%S')}] bare TorchDistributor.run (repeat {repeat + 1}) on "
          f"the job of {source.key}", file=sys.stderr, flush=True)
    base = cluster.shared_dir / f"bare-r{repeat}"
    work = base / "distributed"
    work.mkdir(parents=True)
    job = json.loads((source.job_dir / "job.json").read_text())
    client = MlflowClient(tracking_uri=server.uri)
    source_run = job["tracking"]["run_id"]
    run = client.create_run(client.get_run(source_run).info.experiment_id,
                            tags={"dbspec.benchmark": f"bare peer of run {source_run}"},
                            run_name=f"bare-torchdistributor-r{repeat}")
    job["tracking"] = {"uri": server.uri, "run_id": run.info.run_id}
    if job.get("checkpoint_dir"):
        job["checkpoint_dir"] = str(base / "checkpoints")
    _write_shards(rebuilt_tensors(source.project), work, 2)
    (work / "job.json").write_text(json.dumps(job, default=str))
    # the same session settings as dbspec.spark.spark_session on a spark:// master
    builder = (SparkSession.builder.master(cluster.master).appName("bare-torchdistributor")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.pyspark.python", sys.executable))
    handler = logging.StreamHandler(log)  # the distributor's INFO lines go to the log
    logging.getLogger().addHandler(handler)
    status = "FINISHED"
    try:
        with _fd2_to(log):
            session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        try:
            probe_executors(session, shared=[str(work)])  # the warm-up dbspec's runs get
            with contextlib.redirect_stderr(log):  # the ranks' streamed output
                started = time.time()
                TorchDistributor(num_processes=2, local_mode=False,
                                 use_gpu=False).run(rank_main, str(work))
                finished = time.time()
        finally:
            session.stop()
    except BaseException as exc:
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        if isinstance(exc, KeyboardInterrupt):
            raise
        result.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
        return result
    finally:
        logging.getLogger().removeHandler(handler)
        client.set_terminated(run.info.run_id, status)
    if not (work / "result.json").exists():
        result.error = "no result.json: " + "; ".join(
            p.read_text().strip().splitlines()[-1] for p in work.glob("rank-*.error"))
        return result
    ranks = [json.loads(p.read_text()) for p in sorted(work.glob("rank-*.json"))]
    result.rank_seconds = max(r["seconds"] for r in ranks)
    result.checksum = next((r["checksum"] for r in ranks if r["rank"] == 0), None)
    losses = sorted((m.step, m.timestamp / 1000)
                    for m in client.get_metric_history(run.info.run_id, "train_loss"))
    result.stage = result.distributor = finished - started
    result.first_epoch = next(t for step, t in losses if step == 0) - started
    result.segments = _spans({"start": started, "to_first": losses[0][1],
                              "epochs": losses[-1][1],
                              "to_result": (work / "result.json").stat().st_mtime,
                              "to_return": finished})
    result.job_dir = work
    result.ok = True
    return result


# -- report -----------------------------------------------------------------------------------

def _median(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _spread(values) -> str:
    values = [v for v in values if v is not None]
    return f" [{min(values):.1f}-{max(values):.1f}]" if len(values) > 1 else ""


def _s(value: Optional[float], width: int = 8) -> str:
    return f"{value:>{width}.1f}" if value is not None else f"{'-':>{width}}"


def report(results: dict[str, list[Result]], order: list[str], args, loads) -> None:
    labels = {c.key: c.label for c in CONFIGS} | {BARE: BARE}
    ranks = {c.key: c.ranks for c in CONFIGS} | {BARE: 2}
    print(f"diabetes DDP run (MLP 10-16-1, batch 32, {args.epochs} epochs, gloo, CPU), "
          f"2-worker standalone cluster (1 core each) on one {os.cpu_count()}-core machine, "
          f"load average {loads[0]:.1f} at start, {loads[1]:.1f} at end; median of "
          f"{args.repeats} repeat(s) [min-max]; seconds")
    print(f"  {'configuration':<32} {'ranks':>5} {'1st epoch':>9} {'train stage':>11} "
          f"{'ranks train':>11} {'launch ovh':>10} {'process wall':>12}")
    for key in order:
        done = [r for r in results.get(key, []) if r.ok]
        failed = [r for r in results.get(key, []) if not r.ok]
        if not done:
            print(f"  {labels[key]:<32} {ranks[key]:>5}  failed: "
                  f"{failed[0].error.splitlines()[0]}" if failed else
                  f"  {labels[key]:<32} {ranks[key]:>5}  not run")
            continue
        stage = [r.stage for r in done]
        overhead = [r.stage - r.rank_seconds for r in done if r.rank_seconds is not None]
        print(f"  {labels[key]:<32} {ranks[key]:>5} {_s(_median(r.first_epoch for r in done), 9)}"
              f" {_s(_median(stage), 11)} {_s(_median(r.rank_seconds for r in done), 11)}"
              f" {_s(_median(overhead), 10)} {_s(_median(r.wall for r in done), 12)}"
              f"{_spread(stage)}")
        for failure in failed:
            print(f"    (a repeat failed: {failure.error.splitlines()[0]})")
    print("  1st epoch: train stage start -> rank 0's first train_loss on the server; "
          "train stage: state.json; ranks train: the ranks' own loop seconds (max over ranks); "
          "launch ovh = train stage - ranks train; bare: the distributor call alone")
    shown = [k for k in order if any(r.ok for r in results.get(k, []))]
    if shown:
        print("where the time goes (median seconds):")
        short = {c.key: c.label.split()[0] for c in CONFIGS} | {BARE: "bare"}
        print(f"  {'span':<50}" + "".join(f"{short[k]:>8}" for k in shown))
        for segment, words in SEGMENTS:
            row = [_median(r.segments.get(segment) for r in results[k] if r.ok) for k in shown]
            if any(v is not None for v in row):
                print(f"  {words:<50}" + "".join(_s(v, 8) for v in row))
        if BARE in shown:
            print("  (bare: from the call's start; its warm-up probe and session are untimed)")

    def med(key, what="stage"):
        return _median(getattr(r, what) for r in results.get(key, []) if r.ok)

    def ratio(words, a, b):
        print(f"  {words:<62} " + (f"{a / b:.2f}x  ({a:.1f} s / {b:.1f} s)"
                                   if a is not None and b else "n/a (not run)"))

    dbspec, bare = med("cluster-2"), med(BARE)
    if dbspec is not None and bare is not None:
        spans = {s: _median(r.segments.get(s) for r in results["cluster-2"] if r.ok)
                 for s, _ in SEGMENTS}
        inside = med("cluster-2", "distributor")
        print(f"dbspec adds {dbspec - bare:.1f} s to the bare distributor call "
              f"({dbspec:.1f} s train stage - {bare:.1f} s):")
        for segment in ("to_run", "to_job"):
            print(f"  {dict(SEGMENTS)[segment][7:]:<60} {_s(spans.get(segment), 6)}")
        if inside is not None:
            print(f"  {'its distributor span (incl. RankWatcher, weights) - bare call':<60} "
                  f"{inside - bare:>6.1f}")
        for segment in ("to_model", "log_model", "to_end"):
            print(f"  {dict(SEGMENTS)[segment][7:]:<60} {_s(spans.get(segment), 6)}")
        outside = [_median(r.segments.get(s) for r in results["cluster-2"] if r.ok)
                   for s in ("to_session", "session_probe")]
        print(f"  outside the train stage, not counted: process start {_s(outside[0], 0)} s, "
              f"session + executor probe {_s(outside[1], 0)} s (the bare peer's probe is "
              "untimed too)")
        same = [(r.checksum, b.checksum) for r, b in zip(results["cluster-2"], results[BARE])
                if r.ok and b.ok]
        if same:
            equal = all(a is not None and b is not None and abs(a - b) <= 1e-6 * max(1, abs(a))
                        for a, b in same)
            print(f"  same final weights (rank 0 checksum) in the bare run as in dbspec's: "
                  f"{'yes' if equal else 'NO: ' + str(same)}")
    print("ratios:")
    ratio("2 ranks / 1 rank, train stage (cluster, local_mode false)",
          med("cluster-2"), med("cluster-1"))
    ratio("2 ranks / 1 rank, ranks' training loop", med("cluster-2", "rank_seconds"),
          med("cluster-1", "rank_seconds"))
    ratio("cluster / local[2], train stage (local_mode false)", med("cluster-2"),
          med("local2-2"))
    ratio("cluster / local[2], time to first epoch (local_mode false)",
          med("cluster-2", "first_epoch"), med("local2-2", "first_epoch"))
    ratio("cluster local_mode false / true, train stage", med("cluster-2"), med("cluster-lm"))
    ratio("dbspec train stage / bare TorchDistributor.run", med("cluster-2"), med(BARE))
    ratio("dbspec's distributor span / bare TorchDistributor.run",
          med("cluster-2", "distributor"), med(BARE))


# -- main -------------------------------------------------------------------------------------

def _terminate(signum, frame):
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help=f"only {', '.join(QUICK)} and the bare peer (a smoke check)")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds one dbspec run may take (default 1800)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temp dir (projects, logs, shared dir) and print it")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _terminate)
    from dbspec.tracking.mlflow_tracking import quiet_mlflow

    quiet_mlflow()  # no 'View run ... at URL' lines from the bare peer's run on stdout

    from tests.cluster import mount_namespaces_work, start_cluster, worker_sees
    from tests.servers import start_mlflow_server, stop_mlflow_server

    base = Path(tempfile.mkdtemp(prefix="dbspec-cluster-overhead-"))
    hidden, cluster_root, logs = base / "driver", base / "cluster", base / "logs"
    for directory in (hidden, cluster_root, logs):
        directory.mkdir()
    keep = args.keep
    reason = mount_namespaces_work(str(hidden))
    if reason:
        shutil.rmtree(base, ignore_errors=True)
        sys.exit(f"cluster_overhead: {reason}. The workers must not see the driver's "
                 "directories (as on a second machine); this needs root or CAP_SYS_ADMIN for "
                 "'unshare -m' and 'mount -t tmpfs'.")
    order = [c.key for c in CONFIGS if not args.quick or c.key in QUICK] + [BARE]
    configs = [c for c in CONFIGS if c.key in order]
    results: dict[str, list[Result]] = {key: [] for key in order}
    server_process = cluster = None
    loads = [os.getloadavg()[0]]
    try:
        print(f"  [{time.strftime('%H:%M:%S')}] starting mlflow server and a 2-worker "
              f"cluster under {base}", file=sys.stderr, flush=True)
        server_process, server = start_mlflow_server(hidden / "mlflow-server")
        cluster = start_cluster(cluster_root, [str(hidden)])
        (hidden / "marker").write_text("x")
        if worker_sees(cluster, hidden / "marker"):
            raise RuntimeError(f"a worker sees {hidden}: the mount namespace does not hide it")
        bare_log = (logs / "bare.log").open("a")
        for repeat in range(args.repeats):
            # every other repeat in reverse order: no configuration always meets a fresh cluster
            for config in configs if repeat % 2 == 0 else configs[::-1]:
                result = run_config(config, repeat, epochs=args.epochs, cluster=cluster,
                                    server=server, hidden=hidden, logs=logs,
                                    timeout=args.timeout)
                results[config.key].append(result)
                if not result.ok:
                    keep = True
                    print(f"  {config.key} failed: {result.error}", file=sys.stderr)
            source = results["cluster-2"][-1]
            if source.ok:
                result = bare_peer(source, repeat, cluster=cluster, server=server, log=bare_log)
            else:
                result = Result(BARE, 2, error="configuration cluster-2 failed")
            if not result.ok:
                keep = True
                print(f"  bare peer failed: {result.error} (log {logs / 'bare.log'})",
                      file=sys.stderr)
            results[BARE].append(result)
        loads.append(os.getloadavg()[0])
        report(results, order, args, loads)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the runs, the cluster and the server", file=sys.stderr)
        for process in list(_CHILDREN):
            _kill(process)
        sys.exit(130)
    finally:
        for process in list(_CHILDREN):
            _kill(process)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # let the clean-up finish
        if cluster is not None:
            cluster.stop()
        if server_process is not None:
            stop_mlflow_server(server_process)
        if keep:
            print(f"files kept in {base} (logs in {logs})", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

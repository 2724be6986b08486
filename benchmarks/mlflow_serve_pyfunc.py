"""Is a dbspec model as fast as a plain ``mlflow.pytorch`` model under ``mlflow models serve``?

That server is the path Databricks Model Serving takes: MLflow's own scoring app (FastAPI,
uvicorn, one worker) calls the logged model's pyfunc for every request, after MLflow's schema
enforcement. Both models are served by it, side by side, on 127.0.0.1:

- **dbspec**: ``specs/diabetes.yaml`` trained and registered by ``dbspec run`` in a fresh
  temporary directory (its own SQLite store), served as ``models:/diabetes_predictor/N``
  (or ``--dbspec-model URI``, e.g. a model logged by an earlier dbspec, to compare versions);
- **plain**: the same network with the same weights as the course builds it, an
  ``nn.Sequential`` saved with ``mlflow.pytorch.save_model`` (pickle format, signature inferred
  from a float32 NumPy batch, i.e. a tensor signature). The dbspec model scales its raw input
  and un-scales its output inside; the plain one has both folded into its first and last
  ``Linear``, so the two answer the same rows with the same numbers (checked before any load).

Load: ``wrk -t1 -cC --latency`` POSTing one fixed 1-row body (one real diabetes row) to
``/invocations``, as the course's ``inputs`` and as ``dataframe_split`` with the feature names,
at each concurrency; every (payload, concurrency) case runs on both servers back to back, in
alternating order, after a short warm-up, and the whole set repeats. Any non-2xx answer or socket
error stops the benchmark (a broken set-up, not a slow one).

Printed per case: requests/s (median, min-max), p99 latency (median) and the CPU time the
server process tree spent per request (median; wrk and other work on the machine do not count
in it, so it holds still on a busy machine where requests/s does not); last, the ratios
dbspec/plain of the median requests/s and of requests per server CPU-second. Goal: >= 1.0 for
``inputs``.
Run: ``python benchmarks/mlflow_serve_pyfunc.py [--duration 5] [--repeats 3] [--smoke]``
(needs ``wrk``: ``apt-get install wrk``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import NamedTuple

import _serving_setup as setup

PAYLOADS = ("inputs", "dataframe_split")
GOAL = 1.0  # dbspec's req/s over plain's, inputs
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}  # to milliseconds


class Load(NamedTuple):
    rps: float
    p99_ms: float
    cpu_us: float  # CPU time the server's processes spent per request


def server_cpu_seconds(server: setup.Server) -> float:
    """User + system CPU time of the server and its children (uvicorn runs as a child)."""
    import psutil

    root = psutil.Process(server.process.pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def bodies() -> dict[str, bytes]:
    """The two 1-row request bodies, the same diabetes row in each."""
    names, [row] = setup.diabetes_rows(1)
    return {"inputs": json.dumps({"inputs": [row]}).encode(),
            "dataframe_split": json.dumps({"dataframe_split": {"columns": names,
                                                               "data": [row]}}).encode()}


def train(spec: Path, workdir: Path, smoke: bool) -> str:
    """``dbspec run SPEC`` in ``workdir``; the URI of the version it registered."""
    if not smoke:
        trained = setup.train(spec, workdir)
        os.environ["MLFLOW_TRACKING_URI"] = trained.tracking_uri
        return trained.uri
    result = subprocess.run([sys.executable, "-m", "dbspec", "run", str(spec), "--quiet",
                             "--smoke"], cwd=workdir, env=setup.base_env(), capture_output=True,
                            text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"dbspec run failed:\n{result.stdout}\n{result.stderr}")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{(workdir / '.dbspec' / 'mlflow.db')}"
    import mlflow

    [model] = mlflow.search_registered_models()
    return f"models:/{model.name}/{model.latest_versions[-1].version}"


def save_plain_twin(dbspec_uri: str, into: Path) -> Path:
    """The dbspec model's network as a plain ``mlflow.pytorch`` model, scaling folded in.

    Only for what the diabetes spec builds: one ``scale`` step over every feature, a
    ``Sequential`` that starts and ends with ``Linear``, a regression head.
    """
    import mlflow
    import numpy as np
    import torch
    from mlflow.models import infer_signature
    from torch import nn

    from dbspec.models.served import load_served_model

    local = Path(mlflow.artifacts.download_artifacts(f"{dbspec_uri}", dst_path=str(into / "dl")))
    served = load_served_model(local / "artifacts" / "served")
    card, state = served.card, served.state_dict()
    network = served.network
    if (card.task != "regression" or [s["kind"] for s in card.preprocessing] != ["scale"]
            or not isinstance(network, nn.Sequential) or not isinstance(network[0], nn.Linear)
            or not isinstance(network[-1], nn.Linear)):
        raise SystemExit("the plain twin is built for the diabetes spec's architecture only "
                         "(scale -> Linear ... Linear -> regression)")
    plain = copy.deepcopy(network)
    center, scale = state["transform.center0"], state["transform.scale0"]
    first, last = plain[0], plain[-1]
    with torch.no_grad():  # (x - c) / s -> W x + b  ==  (W / s) x + (b - (W / s) c)
        first.weight.div_(scale)
        first.bias.sub_(first.weight @ center)
        last.weight.mul_(state["target_std"])  # y * std + mean, folded likewise
        last.bias.mul_(state["target_std"]).add_(state["target_mean"])
    plain.eval()
    _, rows = setup.diabetes_rows(32)
    x = np.asarray(rows, dtype=np.float32)
    with torch.no_grad():
        ours = served(torch.from_numpy(x)).numpy()
        theirs = plain(torch.from_numpy(x)).numpy()[:, 0]
    if not np.allclose(ours, theirs, rtol=1e-4, atol=1e-3):
        raise SystemExit(f"the folded plain model disagrees: {ours[:3]} vs {theirs[:3]}")
    path = into / "plain_model"
    mlflow.pytorch.save_model(plain, str(path), serialization_format="pickle",
                              signature=infer_signature(x, theirs[:, None]))
    return path


def start(label: str, model: str, workdir: Path) -> setup.Server:
    port = setup.free_port()
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model, "--env-manager",
               "local", "-h", "127.0.0.1", "-p", str(port)]
    env = setup.base_env()
    env["MLFLOW_TRACKING_URI"] = os.environ["MLFLOW_TRACKING_URI"]
    return setup.Server(label, command, port, cwd=workdir, env=env, log=workdir / f"{label}.log")


def prediction(server: setup.Server, body: bytes) -> float:
    request = urllib.request.Request(server.url + "/invocations", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            [answer] = json.loads(response.read())["predictions"]
    except urllib.error.HTTPError as refused:
        raise SystemExit(f"{server.label} refused {body[:60]!r}...: {refused.code} "
                         f"{refused.read()[:400]!r}") from None
    while isinstance(answer, (list, dict)):  # [[x]] (plain) or {"prediction": x} (dbspec)
        answer = next(iter(answer.values())) if isinstance(answer, dict) else answer[0]
    return float(answer)


def run_wrk(wrk: str, server: setup.Server, script: Path, connections: int,
            seconds: float) -> Load:
    cpu_before = server_cpu_seconds(server)
    result = subprocess.run([wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout",
                             "10s", "--latency", "-s", str(script), server.url + "/invocations"],
                            capture_output=True, text=True, check=False)
    cpu = server_cpu_seconds(server) - cpu_before
    out = result.stdout
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M)
    requests = re.search(r"^\s*(\d+) requests in ", out, re.M)
    p99 = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s|m|h)\s*$", out, re.M)
    broken = re.search(r"Non-2xx or 3xx responses|Socket errors", out)
    exited = server.process.poll() is not None
    if result.returncode != 0 or not (rps and p99 and requests) or broken or exited:
        raise SystemExit(f"wrk against {server.label} (-c{connections}, {script.name}) went "
                         f"wrong:\n{out}\n{result.stderr}\n{server.label}'s log:\n"
                         f"{server.log_tail()}")
    return Load(float(rps.group(1)), float(p99.group(1)) * _UNITS[p99.group(2)],
                cpu / max(1, int(requests.group(1))) * 1e6)


def print_ratios(ratios: list[tuple[str, int, float, float]]) -> None:
    """Per case, then the goal's verdict (the worst ``inputs`` case), last."""
    print("\nratio dbspec/plain: req/s (wall clock; other work on the machine skews it), and "
          "requests per CPU-second of the server (plain's CPU per request / dbspec's)")
    for name, connections, ratio, per_cpu in ratios:
        print(f"ratio dbspec/plain, {name} c={connections}: req/s {ratio:.2f}, "
              f"per CPU-second {per_cpu:.2f}")
    worst = min(ratio for name, _, ratio, _ in ratios if name == "inputs")
    print(f"dbspec / plain req/s, inputs, worst concurrency: {worst:.2f}x; goal >= "
          f"{GOAL:g}x (issue 35): {'PASS' if worst >= GOAL else 'FAIL'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measured run")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before each run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--smoke", action="store_true", help="train with dbspec run --smoke")
    parser.add_argument("--dbspec-model", help="serve this logged dbspec model (a models:/ URI "
                        "with MLFLOW_TRACKING_URI set, or a local directory) instead of training")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed: apt-get install wrk")
    if args.repeats < 1 or args.duration <= 0 or min(args.concurrency) < 1:
        raise SystemExit("--repeats and --concurrency must be >= 1, --duration > 0")

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    workdir = Path(tempfile.mkdtemp(prefix="dbspec-mlflow-serve-"))
    servers: list[setup.Server] = []
    runs: dict[tuple[str, int, str], list[Load]] = {}
    try:
        if args.dbspec_model:
            uri = args.dbspec_model
            os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{workdir / 'none.db'}")
        else:
            uri = train(setup.DIABETES_SPEC, workdir, args.smoke)
        plain_path = save_plain_twin(uri, workdir)
        servers = [start("dbspec", uri, workdir), start("plain", str(plain_path), workdir)]
        for server in servers:
            server.wait_ready()
        payloads = bodies()
        for name, body in payloads.items():
            answers = [prediction(server, body) for server in servers]
            if abs(answers[0] - answers[1]) > 1e-3 * max(1.0, abs(answers[1])):
                raise SystemExit(f"{name}: dbspec answers {answers[0]}, plain {answers[1]}")
        scripts = {}
        for name, body in payloads.items():
            scripts[name] = workdir / f"{name}.lua"
            scripts[name].write_text(f'wrk.method = "POST"\nwrk.body = [==[{body.decode()}]==]\n'
                                     'wrk.headers["Content-Type"] = "application/json"\n')
        print(f"dbspec {uri} and its plain twin ({plain_path.name}) under mlflow models serve; "
              f"{args.repeats} x {args.warmup:g}+{args.duration:g} s per case; load average "
              f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
        for repeat in range(args.repeats):
            for name in PAYLOADS:
                for connections in args.concurrency:
                    order = servers if repeat % 2 == 0 else servers[::-1]
                    for server in order:
                        if args.warmup > 0:
                            run_wrk(wrk, server, scripts[name], connections, args.warmup)
                        load = run_wrk(wrk, server, scripts[name], connections, args.duration)
                        runs.setdefault((name, connections, server.label), []).append(load)
            print(f"  repeat {repeat + 1}/{args.repeats} done", flush=True)
    finally:
        for server in servers:
            server.stop()
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    print(f"load average at the end {os.getloadavg()[0]:.2f} (other work skews absolute figures)")
    print(f"\n{'case':<22} {'server':<7} {'req/s median':>12} {'min-max':>15} {'p99 ms':>8} "
          f"{'CPU us/req':>10}")
    ratios = []
    for name in PAYLOADS:
        for connections in args.concurrency:
            medians, cpu = {}, {}
            for label in ("dbspec", "plain"):
                loads = runs[(name, connections, label)]
                rps = [load.rps for load in loads]
                medians[label] = statistics.median(rps)
                cpu[label] = statistics.median(load.cpu_us for load in loads)
                print(f"{f'{name} c={connections}':<22} {label:<7} {medians[label]:>12,.0f} "
                      f"{f'{min(rps):,.0f}-{max(rps):,.0f}':>15} "
                      f"{statistics.median(load.p99_ms for load in loads):>8.2f} "
                      f"{cpu[label]:>10,.0f}")
            ratios.append((name, connections, medians["dbspec"] / medians["plain"],
                           cpu["plain"] / cpu["dbspec"]))
    print_ratios(ratios)


if __name__ == "__main__":
    sys.exit(main())

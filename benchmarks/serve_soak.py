"""Does ``dbspec serve`` stay correct under a long mixed load, inference table included?

Trains and registers ``specs/diabetes.yaml`` in a fresh temporary directory, then serves it with
``dbspec serve models:/NAME/VERSION --inference-table <tmp>/inference --max-body-bytes 20000``
(bearer token from ``DBSPEC_TOKEN``). For ``--duration`` seconds (default 60), ``--concurrency``
asyncio workers (default 64; aiohttp, keep-alive, as many connections as workers) each send
requests from a fixed rotation, half good and half bad, starting at different points of it:

- good: ``{"inputs": [...]}`` with 1 or 8 real diabetes rows (scaled as sklearn ships them);
- bad, refused with 400: rows of the wrong width, string values, a raw ``NaN`` token, an empty
  ``inputs`` list, malformed JSON; with 415: ``text/plain``; with 401: no ``Authorization``
  header, a wrong token; with 413: a body over ``--max-body-bytes``.

Every answer is recorded: its status and, for a 200, the ``x-request-id`` header and the number
of predictions (must equal the rows sent). ``/metrics`` is scraped after the load; then the
server gets SIGINT, drains, writes the inference table's tail and exits, and the Delta table is
read back: it must hold exactly the answered good requests (by ``request_id``) and their rows,
with the features sent and the predictions returned (an exact match is required only when
``dbspec_inference_log_dropped_total`` is 0; dropped records must then be all that is missing).

Checks: zero 5xx; every good request answered 200 with one prediction per row; the inference
table complete; every bad request refused with its 4xx. Exits 1 if any check fails.

The peer: the same soak against ``mlflow models serve --env-manager local`` (uvicorn, one
worker) on the same registered version, the scoring server Databricks Model Serving runs. The
load is cut into ``--rounds`` rounds, each server's turn alternating first and second, both
servers up the whole time; each gets ``--duration`` seconds in all. The good bodies are the
same for both: ``inputs`` when MLflow's server accepts them (probed first), else
``dataframe_split`` with the feature names, which it does. MLflow's server has no auth, body
limit or inference table, so for it only "zero 5xx" and "every good request answered 200 with
one prediction per row" are checked; what it answers to each bad kind is shown. Last line: the
ratio dbspec/mlflow of the median requests/s over the rounds (``--no-peer`` skips the peer).

``--kill``: the server gets SIGKILL at the end of the load instead, with requests in flight (those
get no answer, which is expected); a second server is started on the same inference table, is
stopped with SIGINT, and the table must then hold every request the first one answered, exactly
once (the report gives the loss and the duplicates). No peer: it checks dbspec's recovery.
Run: ``python benchmarks/serve_soak.py [--duration 60] [--rounds 3] [--concurrency 64] [--kill]
[--no-peer] [--keep]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import NamedTuple, Optional

import _serving_setup as setup

MAX_BODY_BYTES = 20_000
TABLE_TOLERANCE = 1e-5  # relative: the table stores float32 features and predictions


class Kind(NamedTuple):
    name: str
    expected: int  # HTTP status
    rows: int  # rows sent in a good request; 0 for a bad one


GOOD_1, GOOD_8 = Kind("good 1 row", 200, 1), Kind("good 8 rows", 200, 8)
BAD = [Kind("wrong width", 400, 0), Kind("string values", 400, 0), Kind("NaN", 400, 0),
       Kind("empty inputs", 400, 0), Kind("malformed JSON", 400, 0),
       Kind("text/plain", 415, 0), Kind("no auth header", 401, 0),
       Kind("wrong token", 401, 0), Kind("oversized body", 413, 0)]
ROTATION = [kind for i, bad in enumerate(BAD) for kind in ((GOOD_1, GOOD_8)[i % 2], bad)]


class Request(NamedTuple):
    kind: Kind
    body: bytes
    headers: dict[str, str]
    rows: Optional[list]  # the rows of a good request


class Outcome(NamedTuple):
    kind: Kind
    status: Optional[int]  # None: no answer (connection error, timeout)
    error: str = ""
    request_id: Optional[str] = None
    rows: Optional[list] = None  # good requests answered 200: the rows sent...
    predictions: Optional[list] = None  # ...and the predictions returned


def requests_for(rows: list[list[float]], feature_names: list[str],
                 fmt: str = "inputs") -> dict[Kind, list[Request]]:
    """Prepared requests of each kind (good ones: one per starting row), built before the load.
    ``fmt``: the good bodies' format, ``inputs`` or ``dataframe_split`` (named columns)."""
    json_headers = {"Content-Type": "application/json",
                    "Authorization": f"Bearer {setup.TOKEN}"}
    n = len(rows)

    def good(kind: Kind) -> list[Request]:
        out = []
        for start in range(n):
            chunk = [rows[(start + i) % n] for i in range(kind.rows)]
            payload = {"inputs": chunk} if fmt == "inputs" else \
                {"dataframe_split": {"columns": feature_names, "data": chunk}}
            out.append(Request(kind, json.dumps(payload).encode(), json_headers, chunk))
        return out

    row = rows[0]
    oversized, count = [], 0
    while len(json.dumps({"inputs": oversized})) <= 2 * MAX_BODY_BYTES:
        oversized.append(rows[count % n])
        count += 1
    bad_bodies = {
        "wrong width": json.dumps({"inputs": [row[:7]]}),
        "string values": json.dumps({"inputs": [[f"{v:.4f}" for v in row]]}),
        "NaN": '{"inputs": [[NaN, ' + ", ".join(repr(v) for v in row[1:]) + "]]}",
        "empty inputs": '{"inputs": []}',
        "malformed JSON": '{"inputs": [[' + ", ".join(repr(v) for v in row[:5]),
        "text/plain": json.dumps({"inputs": [row]}),
        "no auth header": json.dumps({"inputs": [row]}),
        "wrong token": json.dumps({"inputs": [row]}),
        "oversized body": json.dumps({"inputs": oversized}),
    }
    header_overrides = {
        "text/plain": {"Content-Type": "text/plain", "Authorization": f"Bearer {setup.TOKEN}"},
        "no auth header": {"Content-Type": "application/json"},
        "wrong token": {"Content-Type": "application/json",
                        "Authorization": f"Bearer not-{setup.TOKEN}"},
    }
    prepared = {GOOD_1: good(GOOD_1), GOOD_8: good(GOOD_8)}
    for kind in BAD:
        prepared[kind] = [Request(kind, bad_bodies[kind.name].encode(),
                                  header_overrides.get(kind.name, json_headers), None)]
    return prepared


async def send(session, url: str, request: Request) -> Outcome:
    import aiohttp

    try:
        async with session.post(url, data=request.body, headers=request.headers) as response:
            payload = await response.read()
            if response.status != 200 or request.rows is None:
                return Outcome(request.kind, response.status)
            try:
                predictions = [p["prediction"] for p in json.loads(payload)["predictions"]]
            except (ValueError, KeyError, TypeError) as exc:
                return Outcome(request.kind, response.status,
                               f"unreadable 200 body ({exc}): {payload[:200]!r}")
            return Outcome(request.kind, 200, request_id=response.headers.get("x-request-id"),
                           rows=request.rows, predictions=predictions)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return Outcome(request.kind, None, f"{type(exc).__name__}: {exc}")


async def load(url: str, prepared: dict[Kind, list[Request]], workers: int,
               seconds: float, kill=None) -> tuple[list[Outcome], float]:
    """``workers`` workers sending the rotation for ``seconds``; every outcome, and wall time.
    ``kill``: called at the deadline while the workers are still sending."""
    import aiohttp

    outcomes: list[Outcome] = []
    deadline = time.monotonic() + seconds + (0.5 if kill else 0)
    if kill:
        asyncio.get_running_loop().call_later(seconds, kill)

    async def worker(index: int, session) -> None:
        step = index
        while time.monotonic() < deadline:
            kind = ROTATION[step % len(ROTATION)]
            choices = prepared[kind]
            outcomes.append(await send(session, url, choices[(step * 7 + index) % len(choices)]))
            step += 1

    connector = aiohttp.TCPConnector(limit=workers, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=60)
    started = time.monotonic()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(i, session) for i in range(workers)))
    return outcomes, time.monotonic() - started


def scrape_metrics(url: str) -> str:
    import urllib.request

    request = urllib.request.Request(url + "/metrics",
                                     headers={"Authorization": f"Bearer {setup.TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read().decode()


def metric(text: str, name: str) -> Optional[float]:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def server_statuses(text: str) -> Counter:
    return Counter({int(status): int(count) for status, count in re.findall(
        r'^dbspec_requests_total\{path="/invocations",status="(\d+)"\} (\d+)$', text, re.M)})


def close(a: float, b: float) -> bool:
    return abs(a - b) <= TABLE_TOLERANCE * max(1.0, abs(a), abs(b))


def check_table(path: Path, answered: dict[str, Outcome], feature_names: list[str],
                dropped: int, unanswered: Optional[int] = None) -> tuple[bool, list[str]]:
    """Compare the Delta table with the answered good requests; (complete?, report lines).
    ``unanswered``: after a kill, how many requests got no answer; the server may have logged
    those (a kill between logging and sending the response), so up to that many may be extra."""
    from deltalake import DeltaTable

    table = DeltaTable(str(path)).to_pyarrow_table()
    ids = table.column("request_id").to_pylist()
    features = [table.column(name).to_pylist() for name in feature_names]
    predictions = table.column("prediction").to_pylist()
    by_request: dict[str, list[int]] = defaultdict(list)
    for i, request_id in enumerate(ids):
        by_request[request_id].append(i)
    answered_rows = sum(len(o.rows) for o in answered.values())
    lines = [(f"inference table    {len(ids):,} rows / {len(by_request):,} requests "
              f"(answered: {answered_rows:,} rows / {len(answered):,} good requests)")]
    extra = set(by_request) - set(answered)
    missing = set(answered) - set(by_request)
    wrong, twice = [], []
    for request_id, index in by_request.items():
        outcome = answered.get(request_id)
        if outcome is None:
            continue
        if len(index) > len(outcome.rows):
            twice.append(request_id)
        table_rows = [[column[i] for column in features] for i in index]
        same = len(index) == len(outcome.rows) and all(
            close(a, b) for got, sent in zip(table_rows, outcome.rows) for a, b in zip(got, sent)
        ) and all(close(predictions[i], p) for i, p in zip(index, outcome.predictions))
        if not same:
            wrong.append(request_id)
    lines.append(f"  request_ids not answered: {len(extra)}, answered but missing: "
                 f"{len(missing)} ({len(missing) / max(1, len(answered)):.2%}), logged more than "
                 f"once: {len(twice)}, rows differing from what was sent/returned: {len(wrong)}")
    for label, ids_ in (("not answered", extra), ("missing", missing), ("differing", wrong)):
        if ids_:
            lines.append(f"  e.g. {label}: {sorted(ids_)[:5]}")
    if unanswered is not None:
        lines.append(f"  of the {unanswered:,} requests in flight at the kill, {len(extra):,} "
                     "were logged though their answer never arrived")
        complete = len(extra) <= unanswered and not missing and not wrong and not twice
    elif dropped == 0:
        complete = not extra and not missing and not wrong and len(ids) == answered_rows
    else:
        lines.append(f"  the server dropped {dropped} record(s) (full queue): only those may "
                     "be missing")
        complete = not extra and not wrong and len(missing) == dropped
    return complete, lines


def report(outcomes: list[Outcome], elapsed: float, *, killed: bool = False,
           peer: bool = False) -> tuple[dict[str, bool], dict[str, Outcome]]:
    """Print what was sent and answered; the client-side checks, and the answered good requests.
    After a kill, requests without an answer are expected and left out of the checks.
    ``peer``: MLflow's server, which sends no request ids and refuses less: only the 5xx and
    good-request checks apply."""
    statuses = Counter(o.status for o in outcomes if o.status is not None)
    errors = [o for o in outcomes if o.status is None]
    if killed:
        print(f"killed with requests in flight: {len(errors):,} got no answer (expected)")
        outcomes = [o for o in outcomes if o.status is not None]
        errors = []
    print(f"requests sent      {len(outcomes):,} in {elapsed:.1f} s = "
          f"{len(outcomes) / elapsed:,.0f} req/s")
    print("statuses           " + "  ".join(f"{s}: {c:,}" for s, c in sorted(statuses.items()))
          + (f"  no answer: {len(errors):,}" if errors else ""))
    print(f"{'kind':<16} {'sent':>8} {'expected':>8}  answers")
    for kind in [GOOD_1, GOOD_8, *BAD]:
        mine = [o for o in outcomes if o.kind == kind]
        counts = Counter("no answer" if o.status is None else o.status for o in mine)
        print(f"{kind.name:<16} {len(mine):>8,} {kind.expected:>8}  "
              + "  ".join(f"{s}: {c:,}" for s, c in sorted(counts.items(), key=str)))
    five_xx = [o for o in outcomes if o.status is not None and o.status >= 500]
    good = [o for o in outcomes if o.kind.rows]
    unanswered = [o for o in good if o.status != 200]
    wrong_count = [o for o in good if o.status == 200 and
                   (o.predictions is None or len(o.predictions) != len(o.rows))]
    no_id = [] if peer else [o for o in good if o.status == 200 and not o.request_id]
    answered: dict[str, Outcome] = {}
    duplicate_ids = 0
    for o in good:
        if o.status == 200 and o.request_id:
            duplicate_ids += o.request_id in answered
            answered[o.request_id] = o
    bad = [o for o in outcomes if not o.kind.rows]
    misrefused = [o for o in bad if o.status != o.kind.expected]
    print(f"5xx                {len(five_xx):,}")
    print(f"connection errors  {len(errors):,}")
    print(f"good requests not answered 200: {len(unanswered):,}; answered with the wrong number "
          f"of predictions: {len(wrong_count):,}; without x-request-id: {len(no_id):,}; "
          f"x-request-id reused: {duplicate_ids:,}")
    print(f"bad requests not refused with their expected status: {len(misrefused):,}")
    for label, sample in (("5xx", five_xx), ("no answer", errors), ("good, not 200", unanswered),
                          ("bad, unexpected status", misrefused)):
        for o in sample[:3]:
            print(f"  e.g. {label}: {o.kind.name}: {o.status} {o.error}")
    checks = {
        "zero 5xx": not five_xx,
        "every good request answered 200 with one prediction per row":
            not unanswered and not wrong_count and not no_id and not duplicate_ids,
    }
    if not peer:
        checks["every bad request refused with its 4xx"] = not misrefused
    return checks, answered


def accepts_inputs(server: setup.Server, row: list[float]) -> bool:
    """Whether ``server`` scores ``{"inputs": [row]}`` (MLflow's server refuses it for a model
    with a column signature)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        server.url + "/invocations", data=json.dumps({"inputs": [row]}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {setup.TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status == 200
    except urllib.error.HTTPError as refused:
        print(f"{server.label} refuses inputs rows ({refused.code}: "
              f"{refused.read()[:160]!r}): the good bodies are dataframe_split for both")
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0,
                        help="seconds of load per server (default 60)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds the load is cut into, the servers alternating (default 3)")
    parser.add_argument("--concurrency", type=int, default=64,
                        help="workers, and connections (default 64)")
    parser.add_argument("--spec", default=str(setup.DIABETES_SPEC))
    parser.add_argument("--kill", action="store_true",
                        help="SIGKILL the server at the end of the load, restart it on the same "
                             "inference table, and check that table (no peer)")
    parser.add_argument("--no-peer", action="store_true",
                        help="soak dbspec serve alone, without mlflow models serve")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (store, server logs, inference table)")
    args = parser.parse_args()
    if args.concurrency < 1 or args.duration <= 0 or args.rounds < 1:
        raise SystemExit("--concurrency and --rounds must be >= 1 and --duration > 0")

    workdir = Path(tempfile.mkdtemp(prefix="dbspec-serve-soak-"))
    table_path = workdir / "inference"
    server = peer = None
    rates: dict[str, list[float]] = {"dbspec": [], "mlflow": []}
    good_rates: dict[str, list[float]] = {"dbspec": [], "mlflow": []}
    try:
        trained = setup.train(Path(args.spec).resolve(), workdir)
        server = setup.start_dbspec(trained, setup.free_port(), workdir / "dbspec.log",
                                    "--inference-table", str(table_path),
                                    "--max-body-bytes", str(MAX_BODY_BYTES))
        if not (args.kill or args.no_peer):
            peer = setup.start_mlflow(trained, setup.free_port(), workdir / "mlflow.log")
            peer.wait_ready()
        server.wait_ready()
        feature_names, rows = setup.diabetes_rows(442)
        fmt = "inputs" if peer is None or accepts_inputs(peer, rows[0]) else "dataframe_split"
        prepared = requests_for(rows, feature_names, fmt)
        print(f"soak: {args.duration:g} s per server in {args.rounds} round(s), "
              f"{args.concurrency} workers against {trained.uri}: dbspec on :{server.port} "
              f"(--max-body-bytes {MAX_BODY_BYTES}, --inference-table)"
              + (f", mlflow models serve on :{peer.port}" if peer else "")
              + f"; good bodies: {fmt}", flush=True)
        if args.kill:
            return finish_killed(args, trained, server, table_path, feature_names, prepared,
                                 workdir)
        targets = [("dbspec", server)] + ([("mlflow", peer)] if peer else [])
        outcomes: dict[str, list[Outcome]] = {"dbspec": [], "mlflow": []}
        elapsed: dict[str, float] = {"dbspec": 0.0, "mlflow": 0.0}
        for round_ in range(args.rounds):
            for label, target in targets if round_ % 2 == 0 else targets[::-1]:
                got, seconds = asyncio.run(load(target.url + "/invocations", prepared,
                                                args.concurrency, args.duration / args.rounds))
                outcomes[label] += got
                elapsed[label] += seconds
                rates[label].append(len(got) / seconds)
                good_rates[label].append(sum(o.kind.rows > 0 and o.status == 200
                                             for o in got) / seconds)
                print(f"  round {round_ + 1} {label:<6} {rates[label][-1]:,.0f} req/s "
                      f"({good_rates[label][-1]:,.0f} good answered 200/s)", flush=True)
        metrics = scrape_metrics(server.url)
        print("\n== dbspec serve")
        checks, answered = report(outcomes["dbspec"], elapsed["dbspec"])

        dropped = int(metric(metrics, "dbspec_inference_log_dropped_total") or 0)
        failed = int(metric(metrics, "dbspec_inference_log_failed_writes_total") or 0)
        seen_by_server = server_statuses(metrics)
        seen_by_client = Counter(o.status for o in outcomes["dbspec"] if o.status is not None)
        print(f"/metrics           inference records dropped {dropped}, failed writes {failed}; "
              f"/invocations statuses "
              + ("match the client's" if seen_by_server == seen_by_client else
                 f"differ from the client's: server {dict(sorted(seen_by_server.items()))}"))

        started = time.monotonic()
        server.signal(signal.SIGINT)
        code = server.wait(120)
        if code is None:
            print("the server did not exit within 120 s of SIGINT")
        else:
            print(f"server stopped     exit {code}, {time.monotonic() - started:.1f} s after "
                  "SIGINT")
        stopped = code == 0
        if stopped and table_path.exists():
            complete, lines = check_table(table_path, answered, feature_names, dropped)
            print("\n".join(lines))
        else:
            complete = False
            print("inference table    not checked: "
                  + ("no table was written" if stopped else "the server did not stop cleanly")
                  + f"; its log:\n{server.log_tail()}")
        checks["inference table complete"] = complete and not failed
        if peer is not None:
            print("\n== mlflow models serve (no auth, body limit or inference table: its "
                  "answers to the bad kinds are shown, not checked)")
            peer_checks, _ = report(outcomes["mlflow"], elapsed["mlflow"], peer=True)
            checks.update({f"mlflow models serve: {name}": ok
                           for name, ok in peer_checks.items()})
    finally:
        for running in (server, peer):
            if running is not None:
                running.stop()
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    code = print_checks(checks)
    if rates["mlflow"]:
        print()
        for label in ("dbspec", "mlflow"):
            print(f"{label:<7} req/s over {args.rounds} round(s): min {min(rates[label]):,.0f} "
                  f"median {statistics.median(rates[label]):,.0f}; good answered 200/s median "
                  f"{statistics.median(good_rates[label]):,.0f}")
        print("(mlflow scores the bad kinds it does not refuse: no auth, wrong token, oversized "
              "body; the good-request rate compares the same work)")
        median = {label: (statistics.median(rates[label]), statistics.median(good_rates[label]))
                  for label in rates}
        print(f"ratio dbspec/mlflow (medians): requests/s "
              f"{median['dbspec'][0] / median['mlflow'][0]:.2f}x, good requests answered/s "
              f"{median['dbspec'][1] / max(median['mlflow'][1], 1e-9):.2f}x")
    return code


def print_checks(checks: dict[str, bool]) -> int:
    print()
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(checks.values()) else 1


def finish_killed(args, trained, server, table_path: Path, feature_names: list[str],
                  prepared, workdir: Path) -> int:
    """``--kill``: load, SIGKILL mid-load, restart on the table, stop it, check the table."""
    outcomes, elapsed = asyncio.run(load(server.url + "/invocations", prepared,
                                         args.concurrency, args.duration,
                                         kill=lambda: server.signal(signal.SIGKILL)))
    server.wait(30)
    unanswered = sum(o.status is None for o in outcomes)
    checks, answered = report(outcomes, elapsed, killed=True)
    print(f"first server       SIGKILLed after {args.duration:g} s of load")
    second = setup.start_dbspec(trained, setup.free_port(), workdir / "dbspec-restart.log",
                                "--inference-table", str(table_path),
                                "--max-body-bytes", str(MAX_BODY_BYTES))
    try:
        started = time.monotonic()
        second.wait_ready()
        print(f"second server      ready in {time.monotonic() - started:.1f} s; its log: "
              + " | ".join(line for line in second.log_tail(5).splitlines()
                           if "inference table" in line))
        second.signal(signal.SIGINT)
        code = second.wait(120)
        print(f"second server      exit {code} after SIGINT")
    finally:
        second.stop()
    complete, lines = check_table(table_path, answered, feature_names, 0, unanswered)
    print("\n".join(lines))
    checks["inference table holds every answered request once after SIGKILL"] = complete
    return print_checks(checks)


if __name__ == "__main__":
    sys.exit(main())

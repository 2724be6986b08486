"""What held a training run back, in plain words, from what was measured while it ran.

A finding is made only when the measurements support it with a margin, so other work on the
machine does not flip it between runs: samples taken while other processes saturated the CPUs
measure the competition, not the run, and the CPU-share findings leave them out.
docs/howto/watch-training.md lists each rule with its threshold (the constants below). Everything here
is a pure function of recorded series, so each rule is tested on recordings.
"""

from __future__ import annotations

import statistics
from typing import NamedTuple, Optional, Sequence

from dbspec.observability.resources import Sample

# the machine: a sample is contended at this system CPU when others did OTHERS_MIN_CORES of it
MACHINE_SATURATED_PERCENT = 90.0
OTHERS_MIN_CORES = 0.5  # less is noise (a shell, the tracking server)
MACHINE_BUSY_SHARE = 0.25  # of the samples contended: "the machine was busy"
MIN_QUIET_SAMPLES = 3  # uncontended samples the CPU-share findings need

# the process on a CPU
WAITING_MAX_CORES = 0.5  # with idle CPU: the loop's thread was off its core over half the time
SATURATED_SHARE = 0.9  # of its threads' capacity: compute-bound on the CPU
IDLE_CORES_FOR_THREADS = 1.0  # idle cores measured before "more threads" is advised
DATA_SHARE_BOUND = 0.3  # of the step time gathering batches: gathering is the bottleneck

# a model too small for the hardware to matter: a CPU core sustains well over 10 GFLOP/s on
# dense layers, so under 1 at most a tenth of the step is arithmetic; eager PyTorch overhead is
# ~0.1-2 ms per step, so a step over 10 ms is not explained by overhead alone
OVERHEAD_MAX_GFLOPS = 1.0
OVERHEAD_MAX_STEP_MS = 10.0

# a GPU
GPU_INPUT_BOUND_PERCENT = 50.0  # utilisation under this: the GPU waited for work
GPU_COMPUTE_BOUND_PERCENT = 90.0  # over this: compute-bound, as it should be
HOST_THREAD_BUSY_CORES = 0.9  # the host thread this busy while the GPU idles: CPU-bound feeding

# variability
INPUT_STALL_SHARE = 0.1  # of the epochs' time waiting for streamed shards: an input stall
UNEVEN_BETWEEN_EPOCHS = 0.25  # coefficient of variation of samples/s between epochs
UNEVEN_WITHIN_EPOCHS = 1.0  # mean coefficient of variation of step times within epochs


class Finding(NamedTuple):
    code: str
    message: str
    advice: str = ""

    def text(self) -> str:
        return self.message + (f"; {self.advice}" if self.advice else "")


class RunFacts(NamedTuple):
    """What the training loop knows about itself."""

    device: str  # cpu | cuda | mps
    threads: int
    cpu_count: int
    batch_size: int
    oom_batch_sizes: tuple[int, ...] = ()  # batch sizes that ran out of memory, in order
    gpu_unavailable: Optional[str] = None
    parameters: Optional[int] = None
    flops_per_row: Optional[float] = None  # forward + backward arithmetic of one training row


def _spread(values: Sequence[float]) -> Optional[float]:
    """Coefficient of variation (std / mean), or None with fewer than 3 values."""
    if len(values) < 3 or statistics.fmean(values) <= 0:
        return None
    return statistics.pstdev(values) / statistics.fmean(values)


def _others_cores(sample: Sample, cpu_count: int) -> float:
    """Cores busy with other processes: all the machine's CPU use less this process's own."""
    return max(sample.system_cpu / 100 * cpu_count - sample.process_cpu / 100, 0.0)


def _idle_cores(sample: Sample, cpu_count: int) -> float:
    return max(cpu_count * (1 - sample.system_cpu / 100), 0.0)


def diagnose(samples: Sequence[Sample], history: Sequence[dict], facts: RunFacts
             ) -> list[Finding]:
    """Findings for one run, most important first (never empty)."""
    findings: list[Finding] = []
    if facts.oom_batch_sizes:
        findings.append(_oom(facts))
    quiet, busy = _split_by_load(samples[1:] or samples, facts)
    overhead = _overhead(quiet, history, facts)
    # the overhead finding comes first: it holds however busy the machine was
    findings.extend(f for f in (overhead, busy) if f is not None)
    if overhead is None:
        if facts.device == "cuda" and any(s.gpus for s in samples):
            findings.extend(_gpu(quiet, facts))
        else:
            findings.extend(_cpu(quiet, history, facts))
    if facts.device == "cuda" and facts.gpu_unavailable:
        findings.append(Finding("gpu_unmeasured", f"GPU use was not measured: "
                                                  f"{facts.gpu_unavailable}"))
    uneven = _variability(history, busy=busy is not None)
    findings.extend(f for f in (_input_stall(history), uneven) if f is not None)
    if not findings:
        findings.append(Finding("unmeasured", "the run was too short to measure"))
    return findings


def _split_by_load(samples: Sequence[Sample],
                   facts: RunFacts) -> tuple[list[Sample], Optional[Finding]]:
    """The samples no other process competed with, and the finding when many were contended."""
    quiet: list[Sample] = []
    contended: list[Sample] = []
    for sample in samples:
        others = _others_cores(sample, facts.cpu_count)
        busy = sample.system_cpu >= MACHINE_SATURATED_PERCENT and others >= OTHERS_MIN_CORES
        (contended if busy else quiet).append(sample)
    if not contended or len(contended) < MACHINE_BUSY_SHARE * len(samples):
        return quiet, None
    others = statistics.fmean(_others_cores(s, facts.cpu_count) for s in contended)
    loads = [s.load_average for s in contended if s.load_average is not None]
    load = f", load average {statistics.fmean(loads):.1f}" if loads else ""
    return quiet, Finding(
        "machine_busy", f"the machine was busy with other work: other processes kept "
                        f"{others:.1f} of {facts.cpu_count} core(s) busy (all CPUs at least "
                        f"{MACHINE_SATURATED_PERCENT:.0f}% busy{load}) in {len(contended)} of "
                        f"{len(samples)} samples",
        "the run's CPU share and speed measure that competition, not the run; for a "
        "diagnosis of the run itself, train on a quiet machine")


def _oom(facts: RunFacts) -> Finding:
    sizes = facts.oom_batch_sizes
    if facts.batch_size < sizes[-1]:
        return Finding("oom", f"CUDA ran out of memory at batch size "
                              f"{', '.join(map(str, sizes))}; training went on at "
                              f"{facts.batch_size} (training.auto_batch_size)",
                       f"set training.batch_size: {facts.batch_size} to start there")
    return Finding("oom", f"CUDA ran out of memory at batch size {sizes[-1]}",
                   "lower training.batch_size, add gradient checkpointing for deep models, or "
                   "set training.auto_batch_size: true to retry at half the batch size")


def _waited(quiet: Sequence[Sample]) -> Optional[float]:
    """The process's mean cores on a machine with idle CPU, when that shows it waited."""
    if len(quiet) < MIN_QUIET_SAMPLES:
        return None
    cores = statistics.fmean(s.process_cpu for s in quiet) / 100
    return cores if cores < WAITING_MAX_CORES else None


def _overhead(quiet: list[Sample], history: Sequence[dict], facts: RunFacts) -> Optional[Finding]:
    """The model is too small for the hardware to matter, when the step time says so."""
    steady = list(history[1:]) or list(history)  # the first epoch warms up
    step_ms = [e["step_time_ms"] for e in steady if e.get("step_time_ms")]
    if not facts.flops_per_row or not step_ms or _waited(quiet) is not None:
        return None
    step = statistics.median(step_ms) / 1000
    flops = facts.flops_per_row * facts.batch_size
    rate = flops / step / 1e9
    if rate >= OVERHEAD_MAX_GFLOPS or step * 1000 >= OVERHEAD_MAX_STEP_MS:
        return None
    size = f" ({facts.parameters:,} parameters)" if facts.parameters else ""
    steps = [(e.get("data_seconds", 0.0) + e.get("compute_seconds", 0.0)) / step for e in steady]
    advice = "more threads, a GPU or faster I/O would not change it"
    if steps and statistics.median(steps) >= 2:  # a larger batch has rows to take
        advice = (f"a larger training.batch_size (now {facts.batch_size}) would raise "
                  f"throughput at about the same time per step; {advice}")
    return Finding(
        "overhead_bound", f"the model is too small for the hardware to matter{size}: "
                          f"{step * 1e6:,.0f} µs per step of {facts.batch_size} rows for "
                          f"{_flop(flops)} of arithmetic ({rate:.2g} GFLOP/s), so the "
                          "time is per-step overhead (Python, autograd, the optimizer)", advice)


def _flop(flops: float) -> str:
    return f"{flops / 1e3:,.0f} kFLOP" if flops < 1e6 else f"{flops / 1e6:,.1f} MFLOP"


def _gpu(quiet: Sequence[Sample], facts: RunFacts) -> list[Finding]:
    utilization = [g.utilization for s in quiet for g in s.gpus]
    if len(quiet) < MIN_QUIET_SAMPLES or not utilization:
        return []
    busy = statistics.fmean(utilization)
    host = statistics.fmean(s.process_cpu for s in quiet) / 100
    if busy < GPU_INPUT_BOUND_PERCENT and host >= HOST_THREAD_BUSY_CORES:
        return [Finding("cpu_bound", f"the run kept {host:.1f} core(s) busy while the GPU was "
                                     f"busy only {busy:.0f}%: CPU-bound preprocessing",
                        "move per-row work out of the input path (dbspec's preprocessing steps "
                        "already run inside the model on the GPU) or precompute features")]
    if busy < GPU_INPUT_BOUND_PERCENT:
        return [Finding("input_bound", f"the GPU was busy only {busy:.0f}% of the time: the "
                                       "input pipeline is the bottleneck",
                        f"raise training.batch_size (now {facts.batch_size}) so each step gives "
                        "the GPU more work, and keep the data on the device")]
    if busy > GPU_COMPUTE_BOUND_PERCENT:
        return [Finding("compute_bound", f"the GPU was busy {busy:.0f}% of the time: "
                                         "compute-bound, as it should be")]
    return [Finding("gpu_headroom", f"the GPU was busy {busy:.0f}% of the time: some headroom "
                                    "left", f"a larger training.batch_size (now "
                                            f"{facts.batch_size}) may use it")]


def _cpu(quiet: Sequence[Sample], history: Sequence[dict], facts: RunFacts) -> list[Finding]:
    findings = []
    data = sum(e.get("data_seconds", 0.0) for e in history)
    compute = sum(e.get("compute_seconds", 0.0) for e in history)
    if data + compute > 0:
        share = data / (data + compute)
        if share > DATA_SHARE_BOUND:
            findings.append(Finding(
                "data_bound", f"gathering batches took {share:.0%} of the step time",
                f"raise training.batch_size (now {facts.batch_size}): each step then does more "
                "computing per batch gathered"))
        else:
            findings.append(Finding(
                "compute_share", f"computing took {1 - share:.0%} of the step time, gathering "
                                 f"batches {share:.0%}"))
    if len(quiet) < MIN_QUIET_SAMPLES:
        return findings
    waited = _waited(quiet)
    busy = statistics.fmean(s.process_cpu for s in quiet) / 100
    idle = statistics.fmean(_idle_cores(s, facts.cpu_count) for s in quiet)
    if waited is not None:
        findings.append(Finding(
            "cpu_waiting", f"the run was on a core only {waited:.0%} of the time while the "
                           f"machine had {idle:.1f} idle core(s): it waited on something else",
            "look at I/O, logging and checkpoint writes (training.checkpointing.every_n_epochs)"))
    elif busy >= SATURATED_SHARE * facts.threads:
        advice = ""
        if facts.threads < facts.cpu_count and idle >= IDLE_CORES_FOR_THREADS:
            advice = (f"more threads (training.num_threads; {facts.cpu_count} cores here) "
                      f"would speed it up: {idle:.1f} core(s) were idle")
        elif facts.threads >= facts.cpu_count:
            advice = "a GPU would speed it up"
        who = (f"all {facts.cpu_count} core(s)" if facts.threads >= facts.cpu_count
               else f"{busy:.1f} core(s) with its {facts.threads} training thread(s)")
        findings.append(Finding("cpu_saturated", f"the run kept {who} busy: compute-bound on "
                                                 "the CPU", advice))
    return findings


def _input_stall(history: Sequence[dict]) -> Optional[Finding]:
    """How long a streamed run waited for its shards (None for in-memory data): a finding
    with advice over :data:`INPUT_STALL_SHARE` of the epochs' time, else the figure alone."""
    stalls = [e["input_stall_seconds"] for e in history if "input_stall_seconds" in e]
    if not stalls:
        return None
    waited = sum(stalls)
    spent = sum(e.get("epoch_seconds", 0.0) for e in history if "input_stall_seconds" in e)
    share = waited / spent if spent > 0 else 0.0
    if share > INPUT_STALL_SHARE:
        return Finding("input_stalled", f"training waited for streamed shards {share:.0%} of "
                                        f"its time ({waited:.1f} s): an input stall",
                       "raise data.streaming.prefetch (windows read ahead), set "
                       "data.streaming.cache_dir to a local disk when the shards' location is "
                       "remote or slow, or use larger shards (shard_size_mb)")
    return Finding("input_kept_up", f"the shard stream kept up: training waited for data "
                                    f"{share:.1%} of its time ({waited:.2f} s)")


def _variability(history: Sequence[dict], *, busy: bool) -> Optional[Finding]:
    steady = list(history[1:])  # the first epoch warms up
    between = _spread([e["samples_per_second"] for e in steady if e.get("samples_per_second")])
    cvs = [e["step_time_cv"] for e in steady if e.get("step_time_cv") is not None]
    within = statistics.fmean(cvs) if cvs else None
    # with the machine busy, that is the cause measured; otherwise the cause is not measured
    cause = (" while other processes competed for the CPU" if busy
             else ": uneven batches, pauses or other work on the machine")
    if between is not None and between > UNEVEN_BETWEEN_EPOCHS:
        return Finding("uneven", f"throughput varied by {between:.0%} between epochs{cause}",
                       "" if busy else "look for other work on the machine, checkpoint writes, "
                                       "or data read during training")
    if within is not None and within > UNEVEN_WITHIN_EPOCHS:
        return Finding("uneven", f"step times varied by {within:.0%} within epochs{cause}",
                       "use a batch size that divides the rows, and check for pauses (garbage "
                       "collection, I/O)")
    return None

"""What held a training run back, in plain words, from what was measured while it ran.

The rules follow the usual table: GPU utilisation under 50% means the input pipeline is the
bottleneck; over 90% means compute-bound (good); a saturated CPU with an idle GPU means CPU-bound
preprocessing; throughput that varies widely means uneven batches or irregular I/O; a CUDA
out-of-memory error asks for a smaller batch or gradient checkpointing. On CPU-only runs the
diagnosis uses what can be measured there: the split of step time into gathering batches and
computing, the training threads, and how busy they kept the CPU.

Everything here is a pure function of recorded series, so each rule is tested on recordings.
"""

from __future__ import annotations

import statistics
from typing import NamedTuple, Optional, Sequence

from dbspec.monitoring.resources import Sample


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


def _mean(values: Sequence[float]) -> Optional[float]:
    return statistics.fmean(values) if values else None


def _spread(values: Sequence[float]) -> Optional[float]:
    """Coefficient of variation (std / mean), or None with fewer than 3 values."""
    if len(values) < 3 or statistics.fmean(values) <= 0:
        return None
    return statistics.pstdev(values) / statistics.fmean(values)


def diagnose(samples: Sequence[Sample], history: Sequence[dict], facts: RunFacts
             ) -> list[Finding]:
    """Findings for one run, most important first (never empty)."""
    findings: list[Finding] = []
    if facts.oom_batch_sizes:
        findings.append(_oom(facts))
    gpu_samples = [g.utilization for s in samples[1:] or samples for g in s.gpus]
    if facts.device == "cuda" and gpu_samples:
        findings.extend(_gpu(samples, gpu_samples, facts))
    else:
        findings.extend(_cpu(samples, history, facts))
    uneven = _variability(history)
    if uneven is not None:
        findings.append(uneven)
    return findings


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


def _gpu(samples: Sequence[Sample], utilization: list[float], facts: RunFacts) -> list[Finding]:
    busy = statistics.fmean(utilization)
    cpu = _mean([s.system_cpu for s in samples[1:] or samples]) or 0.0
    if busy < 50 and cpu > 95:
        return [Finding("cpu_bound", f"the CPU was {cpu:.0f}% busy while the GPU was busy only "
                                     f"{busy:.0f}%: CPU-bound preprocessing",
                        "move per-row work out of the input path (dbspec's preprocessing steps "
                        "already run inside the model on the GPU) or precompute features")]
    if busy < 50:
        return [Finding("input_bound", f"the GPU was busy only {busy:.0f}% of the time: the "
                                       "input pipeline is the bottleneck",
                        f"raise training.batch_size (now {facts.batch_size}) so each step gives "
                        "the GPU more work, and keep the data on the device")]
    if busy > 90:
        return [Finding("compute_bound", f"the GPU was busy {busy:.0f}% of the time: "
                                         "compute-bound, as it should be")]
    return [Finding("gpu_headroom", f"the GPU was busy {busy:.0f}% of the time: some headroom "
                                    "left", f"a larger training.batch_size (now "
                                            f"{facts.batch_size}) may use it")]


def _cpu(samples: Sequence[Sample], history: Sequence[dict], facts: RunFacts) -> list[Finding]:
    findings = []
    data = sum(e.get("data_seconds", 0.0) for e in history)
    compute = sum(e.get("compute_seconds", 0.0) for e in history)
    if data + compute > 0:
        share = data / (data + compute)
        if share > 0.3:
            findings.append(Finding(
                "data_bound", f"gathering batches took {share:.0%} of the step time",
                f"raise training.batch_size (now {facts.batch_size}): each step then does more "
                "computing per batch gathered"))
        else:
            findings.append(Finding(
                "compute_share", f"computing took {1 - share:.0%} of the step time, gathering "
                                 f"batches {share:.0%}"))
    busy = _mean([s.process_cpu for s in samples[1:] or samples])
    if busy is not None:
        capacity = 100.0 * facts.threads
        if busy >= 0.9 * capacity and facts.threads < facts.cpu_count:
            findings.append(Finding(
                "cpu_saturated", f"the {facts.threads} training thread(s) kept "
                                 f"{busy / 100:.1f} core(s) busy: compute-bound on the CPU",
                f"more threads (training.num_threads; {facts.cpu_count} cores here) or a GPU "
                "would speed it up"))
        elif busy >= 0.9 * capacity:
            findings.append(Finding(
                "cpu_saturated", f"the run kept all {facts.cpu_count} core(s) busy: "
                                 "compute-bound on the CPU", "a GPU would speed it up"))
        elif busy < 0.5 * capacity:
            findings.append(Finding(
                "cpu_waiting", f"the {facts.threads} training thread(s) were busy only "
                               f"{busy / capacity:.0%} of the time: the run waited on something "
                               "else",
                "look at I/O, logging and checkpoint writes "
                "(training.checkpointing.every_n_epochs)"))
    if facts.device == "cuda" and facts.gpu_unavailable:
        findings.append(Finding("gpu_unmeasured", f"GPU use was not measured: "
                                                  f"{facts.gpu_unavailable}"))
    if not findings:
        findings.append(Finding("unmeasured", "the run was too short to measure"))
    return findings


def _variability(history: Sequence[dict]) -> Optional[Finding]:
    steady = list(history[1:])  # the first epoch warms up
    between = _spread([e["samples_per_second"] for e in steady if e.get("samples_per_second")])
    within = _mean([e["step_time_cv"] for e in steady if e.get("step_time_cv") is not None])
    if between is not None and between > 0.25:
        return Finding("uneven", f"throughput varied by {between:.0%} between epochs: uneven "
                                 "batches or irregular I/O",
                       "look for other work on the machine, checkpoint writes, or data read "
                       "during training")
    if within is not None and within > 1.0:
        return Finding("uneven", f"step times varied by {within:.0%} within epochs: uneven "
                                 "batches or irregular I/O",
                       "use a batch size that divides the rows, and check for pauses (garbage "
                       "collection, I/O)")
    return None

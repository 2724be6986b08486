"""The resource monitor on this machine: real psutil samples, and the no-GPU path of NVML."""

from __future__ import annotations

import time

from dbspec.observability.resources import GpuProbe, ResourceMonitor, sample_metrics


def test_without_nvml_or_a_gpu_the_probe_says_so_once_and_reads_nothing():
    probe = GpuProbe()
    try:
        import torch

        if torch.cuda.is_available():
            import pytest

            pytest.skip("this machine has a GPU")
    except ImportError:
        pass
    assert probe.handles == [] and probe.unavailable
    assert probe.read() == ()
    assert probe.read() == ()  # no retry, no error, on every later sample


def test_the_monitor_samples_in_the_background():
    with ResourceMonitor(0.05) as monitor:
        deadline = time.monotonic() + 5
        total = 0
        while len(monitor.samples) < 3 and time.monotonic() < deadline:
            total += sum(i * i for i in range(20000))  # some CPU work to measure
    assert len(monitor.samples) >= 4  # three in the loop and one at the end
    last = monitor.samples[-1]
    assert last.process_rss_mb > 10 and 0 <= last.system_memory <= 100
    assert last.process_cpu >= 0 and last.gpus == ()
    assert last.load_average is None or last.load_average >= 0  # None on Windows
    metrics = sample_metrics(last)
    assert set(metrics) == {"process_cpu_percent", "system_cpu_percent", "process_rss_mb",
                            "system_memory_percent"}

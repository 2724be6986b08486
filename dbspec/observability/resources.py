"""A background sampler of CPU, memory and GPU use while training runs.

GPUs are read through nvidia-ml-py (``pynvml``). Without a GPU or the NVML library the probe
says so once and the GPU fields stay unavailable: no error, no retry on every sample.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment (not a NamedTuple: its ``index`` method would shadow the field)."""

    index: int
    utilization: float  # percent of the interval a kernel ran
    memory_used_mb: float
    memory_total_mb: float
    temperature_c: Optional[float]


class Sample(NamedTuple):
    at: float  # seconds since the monitor started
    process_cpu: float  # percent of one core (200 = two cores busy)
    system_cpu: float  # percent of all cores
    process_rss_mb: float
    system_memory: float  # percent used
    gpus: tuple[GpuSample, ...]
    load_average: Optional[float] = None  # runnable processes, 1-minute average (os.getloadavg)


class GpuProbe:
    """NVML handles, opened once; ``unavailable`` says why there are none."""

    def __init__(self):
        self.handles: list[Any] = []
        self.unavailable: Optional[str] = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                            for i in range(pynvml.nvmlDeviceGetCount())]
            if not self.handles:
                self.unavailable = "NVML reports no GPU"
        except ImportError:
            self.unavailable = "nvidia-ml-py is not installed"
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            self.unavailable = f"NVML unavailable ({type(exc).__name__})"

    def read(self) -> tuple[GpuSample, ...]:
        if not self.handles:
            return ()
        nvml, out = self._nvml, []
        for i, handle in enumerate(self.handles):
            try:
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                try:
                    temperature = float(nvml.nvmlDeviceGetTemperature(
                        handle, nvml.NVML_TEMPERATURE_GPU))
                except Exception:  # some boards do not report it
                    temperature = None
                out.append(GpuSample(i, float(rates.gpu), memory.used / 2**20,
                                     memory.total / 2**20, temperature))
            except Exception:  # a GPU that fell off the bus: stop asking
                self.handles, self.unavailable = [], "NVML stopped answering"
                return ()
        return tuple(out)


class ResourceMonitor:
    """Samples every ``interval`` seconds on a daemon thread; ``samples`` keeps them all."""

    def __init__(self, interval: float = 1.0, *, probe: Optional[GpuProbe] = None):
        import psutil

        self.interval = interval
        self.process = psutil.Process(os.getpid())
        self._psutil = psutil
        self.probe = probe if probe is not None else GpuProbe()
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dbspec-monitor", daemon=True)
        self._started = 0.0

    @property
    def gpu_unavailable(self) -> Optional[str]:
        return self.probe.unavailable

    def __enter__(self) -> "ResourceMonitor":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        self._started = time.monotonic()
        self.process.cpu_percent(None)  # the first call only sets the reference point
        self._psutil.cpu_percent(None)
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(timeout=5)
            self.sample()  # the tail of the run

    def latest(self) -> Optional[Sample]:
        return self.samples[-1] if self.samples else None

    def sample(self) -> Sample:
        memory = self.process.memory_info().rss / 2**20
        taken = Sample(time.monotonic() - self._started, self.process.cpu_percent(None),
                       self._psutil.cpu_percent(None), memory,
                       self._psutil.virtual_memory().percent, self.probe.read(),
                       _load_average())
        self.samples.append(taken)
        return taken

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()


def _load_average() -> Optional[float]:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows has none
        return None


def sample_metrics(sample: Sample) -> dict[str, float]:
    """A sample as MLflow metric names."""
    out = {"process_cpu_percent": sample.process_cpu, "system_cpu_percent": sample.system_cpu,
           "process_rss_mb": sample.process_rss_mb,
           "system_memory_percent": sample.system_memory}
    for gpu in sample.gpus:
        out[f"gpu{gpu.index}_utilization_percent"] = gpu.utilization
        out[f"gpu{gpu.index}_memory_used_mb"] = gpu.memory_used_mb
        if gpu.temperature_c is not None:
            out[f"gpu{gpu.index}_temperature_c"] = gpu.temperature_c
    return out

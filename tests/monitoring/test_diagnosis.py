"""The diagnosis rules, on recorded (synthetic) metric series."""

from __future__ import annotations

import pytest

from dbspec.monitoring.diagnosis import RunFacts, diagnose
from dbspec.monitoring.resources import GpuSample, Sample


def samples(gpu_util=None, process_cpu=95.0, system_cpu=50.0, n=10):
    out = []
    for i in range(n):
        gpus = () if gpu_util is None else (GpuSample(0, gpu_util, 1000.0, 24000.0, 60.0),)
        out.append(Sample(float(i), process_cpu, system_cpu, 500.0, 40.0, gpus))
    return out


def epochs(n=6, data=0.1, compute=0.9, speed=(1000.0,), cv=0.1):
    return [{"data_seconds": data, "compute_seconds": compute,
             "samples_per_second": speed[i % len(speed)], "step_time_cv": cv} for i in range(n)]


CUDA = RunFacts(device="cuda", threads=4, cpu_count=16, batch_size=64)
CPU = RunFacts(device="cpu", threads=1, cpu_count=2, batch_size=32)


def codes(findings):
    return [f.code for f in findings]


def test_a_data_bound_gpu_run_blames_the_input_pipeline():
    found = diagnose(samples(gpu_util=23.0), epochs(), CUDA)
    assert codes(found) == ["input_bound"]
    assert "busy only 23%" in found[0].message
    assert "training.batch_size (now 64)" in found[0].advice


def test_a_compute_bound_gpu_run_is_good():
    found = diagnose(samples(gpu_util=97.0), epochs(), CUDA)
    assert codes(found) == ["compute_bound"]
    assert "as it should be" in found[0].message


def test_the_middle_band_reports_headroom():
    assert codes(diagnose(samples(gpu_util=70.0), epochs(), CUDA)) == ["gpu_headroom"]


def test_a_busy_cpu_with_an_idle_gpu_is_cpu_bound_preprocessing():
    found = diagnose(samples(gpu_util=20.0, system_cpu=99.0), epochs(), CUDA)
    assert codes(found) == ["cpu_bound"]


def test_the_first_sample_is_left_out_as_warm_up():
    recorded = samples(gpu_util=95.0)
    recorded[0] = recorded[0]._replace(gpus=(GpuSample(0, 0.0, 0.0, 24000.0, None),))
    assert codes(diagnose(recorded, epochs(), CUDA)) == ["compute_bound"]


def test_uneven_throughput_between_epochs():
    found = diagnose(samples(gpu_util=95.0), epochs(speed=(1000.0, 300.0, 1200.0)), CUDA)
    assert codes(found) == ["compute_bound", "uneven"]
    assert "between epochs" in found[1].message


def test_uneven_steps_within_epochs():
    found = diagnose(samples(gpu_util=95.0), epochs(cv=1.8), CUDA)
    assert codes(found)[-1] == "uneven" and "within epochs" in found[-1].message


def test_steady_runs_are_not_called_uneven():
    assert "uneven" not in codes(diagnose(samples(gpu_util=95.0), epochs(cv=0.2), CUDA))


@pytest.mark.parametrize("facts, message", [
    (CUDA._replace(oom_batch_sizes=(64,)), "ran out of memory at batch size 64"),
    (CUDA._replace(batch_size=16, oom_batch_sizes=(64, 32)),
     "training went on at 16 (training.auto_batch_size)"),
])
def test_out_of_memory_comes_first(facts, message):
    found = diagnose(samples(gpu_util=95.0), epochs(), facts)
    assert found[0].code == "oom" and message in found[0].message


def test_cpu_run_whose_time_goes_to_gathering_batches():
    found = diagnose(samples(process_cpu=98.0), epochs(data=0.6, compute=0.4), CPU)
    assert codes(found)[0] == "data_bound"
    assert "60% of the step time" in found[0].message


def test_cpu_run_that_saturates_its_thread_with_cores_to_spare():
    found = diagnose(samples(process_cpu=99.0), epochs(), CPU)
    assert codes(found) == ["compute_share", "cpu_saturated"]
    assert "more threads (training.num_threads; 2 cores here)" in found[1].advice


def test_cpu_run_that_keeps_every_core_busy():
    facts = CPU._replace(threads=2)
    found = diagnose(samples(process_cpu=196.0), epochs(), facts)
    assert codes(found)[1] == "cpu_saturated" and "all 2 core(s)" in found[1].message


def test_cpu_run_that_waits():
    found = diagnose(samples(process_cpu=20.0), epochs(), CPU)
    assert codes(found)[1] == "cpu_waiting"


def test_a_gpu_run_without_nvml_says_what_it_could_not_measure():
    facts = CUDA._replace(gpu_unavailable="NVML unavailable (NVMLError_LibraryNotFound)")
    found = diagnose(samples(), epochs(), facts)
    assert found[-1].code == "gpu_unmeasured"


def test_a_run_with_nothing_recorded_still_gets_a_finding():
    assert codes(diagnose([], [], CPU)) == ["unmeasured"]

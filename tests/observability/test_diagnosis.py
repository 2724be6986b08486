"""The diagnosis rules, on recorded (synthetic) metric series."""

from __future__ import annotations

import pytest

from dbspec.observability.diagnosis import RunFacts, diagnose
from dbspec.observability.resources import GpuSample, Sample


def samples(gpu_util=None, process_cpu=95.0, system_cpu=50.0, n=10, load_average=None):
    out = []
    for i in range(n):
        gpus = () if gpu_util is None else (GpuSample(0, gpu_util, 1000.0, 24000.0, 60.0),)
        out.append(Sample(float(i), process_cpu, system_cpu, 500.0, 40.0, gpus, load_average))
    return out


def epochs(n=6, data=0.1, compute=0.9, speed=(1000.0,), cv=0.1, step_ms=None):
    out = [{"data_seconds": data, "compute_seconds": compute,
            "samples_per_second": speed[i % len(speed)], "step_time_cv": cv} for i in range(n)]
    for epoch in out if step_ms is not None else ():
        epoch["step_time_ms"] = step_ms
    return out


CUDA = RunFacts(device="cuda", threads=4, cpu_count=16, batch_size=64)
CPU = RunFacts(device="cpu", threads=1, cpu_count=2, batch_size=32)


def codes(findings):
    return [f.code for f in findings]


def test_a_data_bound_gpu_run_blames_the_input_pipeline():
    # the host thread mostly off its core: it waited for input, it did not feed the GPU flat out
    found = diagnose(samples(gpu_util=23.0, process_cpu=30.0, system_cpu=5.0), epochs(), CUDA)
    assert codes(found) == ["input_bound"]
    assert "busy only 23%" in found[0].message
    assert "training.batch_size (now 64)" in found[0].advice


def test_a_compute_bound_gpu_run_is_good():
    found = diagnose(samples(gpu_util=97.0), epochs(), CUDA)
    assert codes(found) == ["compute_bound"]
    assert "as it should be" in found[0].message


def test_the_middle_band_reports_headroom():
    assert codes(diagnose(samples(gpu_util=70.0), epochs(), CUDA)) == ["gpu_headroom"]


def test_a_busy_host_thread_with_an_idle_gpu_is_cpu_bound_preprocessing():
    # the run's own process, not the machine's CPU, is what shows CPU-bound feeding
    found = diagnose(samples(gpu_util=20.0, process_cpu=100.0, system_cpu=10.0), epochs(), CUDA)
    assert codes(found) == ["cpu_bound"]
    assert "kept 1.0 core(s) busy" in found[0].message


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
    found = diagnose(samples(process_cpu=196.0, system_cpu=99.0), epochs(), facts)
    assert codes(found)[1] == "cpu_saturated" and "all 2 core(s)" in found[1].message


def test_cpu_run_that_waits():
    found = diagnose(samples(process_cpu=20.0), epochs(), CPU)
    assert codes(found)[1] == "cpu_waiting"
    assert "on a core only 20% of the time while the machine had 1.0 idle core(s)" in \
        found[1].message


def test_a_gpu_run_without_nvml_says_what_it_could_not_measure():
    facts = CUDA._replace(gpu_unavailable="NVML unavailable (NVMLError_LibraryNotFound)")
    found = diagnose(samples(), epochs(), facts)
    assert found[-1].code == "gpu_unmeasured"


def test_a_run_with_nothing_recorded_still_gets_a_finding():
    assert codes(diagnose([], [], CPU)) == ["unmeasured"]


# --- issue 15, item 8: the diabetes MLP (385 parameters, batch 32, ~265 training rows) -------
# forward 2 x (10 x 32 + 32 x 1) = 704 FLOP a row, x 3 with the backward pass
DIABETES = RunFacts(device="cpu", threads=1, cpu_count=2, batch_size=32, parameters=385,
                    flops_per_row=2112.0)
# nine steps of 0.3 ms an epoch: the time a step takes on a quiet 2-core machine
TINY_EPOCHS = dict(data=0.0002, compute=0.0025, step_ms=0.3, speed=(98_000.0,))


@pytest.mark.parametrize("load", [
    dict(process_cpu=99.0, system_cpu=52.0),  # quiet: was "more threads or a GPU"
    dict(process_cpu=45.0, system_cpu=100.0),  # loaded: was "waited ... look at I/O"
])
def test_a_tiny_model_is_overhead_bound_however_busy_the_machine(load):
    found = diagnose(samples(**load), epochs(**TINY_EPOCHS), DIABETES)
    assert found[0].code == "overhead_bound"
    assert found[0].message.startswith("the model is too small for the hardware to matter "
                                       "(385 parameters): 300 µs per step of 32 rows for "
                                       "68 kFLOP of arithmetic")
    assert "a larger training.batch_size (now 32) would raise throughput" in found[0].advice
    assert not {"cpu_saturated", "cpu_waiting", "data_bound", "compute_share"} & set(codes(found))


def test_the_loaded_tiny_run_also_says_the_machine_was_busy():
    found = diagnose(samples(process_cpu=45.0, system_cpu=100.0, load_average=3.6),
                     epochs(**TINY_EPOCHS), DIABETES)
    assert codes(found) == ["overhead_bound", "machine_busy"]
    assert "other processes kept 1.6 of 2 core(s) busy" in found[1].message
    assert "load average 3.6" in found[1].message and "9 of 9 samples" in found[1].message


def test_a_tiny_model_on_a_gpu_is_overhead_bound_not_input_bound():
    facts = DIABETES._replace(device="cuda", cpu_count=16)
    found = diagnose(samples(gpu_util=4.0, process_cpu=100.0, system_cpu=7.0),
                     epochs(**TINY_EPOCHS), facts)
    assert codes(found) == ["overhead_bound"]


def test_without_a_counted_model_size_no_overhead_is_claimed():
    found = diagnose(samples(process_cpu=99.0), epochs(**TINY_EPOCHS),
                     DIABETES._replace(flops_per_row=None))
    assert "overhead_bound" not in codes(found)


@pytest.mark.parametrize("change", [
    dict(flops_per_row=2112.0 * 1000),  # 68 MFLOP in 0.3 ms: 230 GFLOP/s of arithmetic
    dict(batch_size=32 * 500),  # as many FLOP from a larger batch
])
def test_a_step_whose_arithmetic_explains_its_time_is_not_overhead(change):
    found = diagnose(samples(process_cpu=99.0), epochs(**TINY_EPOCHS), DIABETES._replace(**change))
    assert "overhead_bound" not in codes(found)
    assert "cpu_saturated" in codes(found)


def test_a_slow_step_is_not_explained_by_overhead():
    slow = {**TINY_EPOCHS, "step_ms": 25.0, "compute": 0.225}
    assert "overhead_bound" not in codes(diagnose(samples(process_cpu=99.0), epochs(**slow),
                                                  DIABETES))


def test_a_larger_batch_is_advised_only_where_an_epoch_has_rows_for_it():
    one_step = {**TINY_EPOCHS, "data": 0.00002, "compute": 0.00028}  # 0.3 ms: one step an epoch
    found = diagnose(samples(process_cpu=99.0), epochs(**one_step), DIABETES)
    assert found[0].code == "overhead_bound" and "batch_size" not in found[0].advice


def test_a_tiny_model_that_stalls_on_its_data_is_waiting_not_overhead():
    stalled = {**TINY_EPOCHS, "step_ms": 2.0, "data": 0.015, "compute": 0.003}
    found = diagnose(samples(process_cpu=15.0, system_cpu=9.0), epochs(**stalled), DIABETES)
    assert codes(found) == ["data_bound", "cpu_waiting"]
    assert "look at I/O" in found[1].advice


def test_a_data_loading_stall_is_reported_as_waiting():
    found = diagnose(samples(process_cpu=12.0, system_cpu=8.0), epochs(data=0.8, compute=0.2),
                     CPU)
    assert codes(found) == ["data_bound", "cpu_waiting"]
    assert "gathering batches took 80% of the step time" in found[0].message


def test_a_busy_machine_is_called_busy_not_waiting_on_io():
    found = diagnose(samples(process_cpu=40.0, system_cpu=100.0), epochs(), CPU)
    assert codes(found) == ["machine_busy", "compute_share"]
    assert "the machine was busy with other work" in found[0].message


def test_a_busy_machine_is_not_cpu_bound_preprocessing_on_a_gpu():
    # 16 cores saturated by others while this run's host thread got 0.4 of one
    found = diagnose(samples(gpu_util=20.0, process_cpu=40.0, system_cpu=99.0), epochs(), CUDA)
    assert codes(found) == ["machine_busy"]


def test_a_few_busy_samples_leave_the_quiet_ones_to_diagnose():
    recorded = samples(process_cpu=99.0, system_cpu=52.0)
    recorded[3] = recorded[3]._replace(process_cpu=40.0, system_cpu=100.0)
    found = diagnose(recorded, epochs(), CPU)
    assert codes(found) == ["compute_share", "cpu_saturated"]


def test_too_few_quiet_samples_make_no_cpu_share_finding():
    recorded = samples(process_cpu=40.0, system_cpu=100.0)
    recorded[1:3] = samples(process_cpu=20.0, system_cpu=30.0, n=2)
    found = diagnose(recorded, epochs(), CPU)
    assert "cpu_waiting" not in codes(found) and "machine_busy" in codes(found)


def test_threads_the_small_ops_leave_idle_are_not_waiting():
    # 4 threads, 1.2 cores busy on a quiet 16-core machine: the ops did not use every thread
    found = diagnose(samples(process_cpu=120.0, system_cpu=9.0), epochs(), CUDA._replace(
        device="cpu"))
    assert codes(found) == ["compute_share"]


def test_more_threads_are_advised_only_with_idle_cores():
    # 1 thread saturated on 2 cores, the other core busy with 0.6 of another process
    found = diagnose(samples(process_cpu=99.0, system_cpu=80.0), epochs(), CPU)
    assert codes(found)[-1] == "cpu_saturated" and found[-1].advice == ""


def test_uneven_throughput_on_a_busy_machine_names_the_competition_not_io():
    found = diagnose(samples(process_cpu=45.0, system_cpu=100.0),
                     epochs(speed=(1000.0, 300.0, 1200.0)), CPU)
    assert found[-1].code == "uneven"
    assert found[-1].message.endswith("between epochs while other processes competed for the CPU")
    assert "I/O" not in found[-1].text()

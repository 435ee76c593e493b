"""`make gpu-check`'s decisions (tests/bench/gpu_check_rules.py) and `make bench`'s device
(tests/bench/device.py): which device, whether the VRAM came back, what the report says. The
sequence itself runs in tests/integration/test_gpu_check.py (on the CPU here)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.bench import gpu_check_rules as rules
from tests.bench.device import DEVICE_ENV, BenchDeviceError, bench_device, resolve_device

MIB = rules.MIB
NO_NVML = "NVMLError_LibraryNotFound: NVML Shared Library Not Found"
CPU_NODE = rules.CudaPresence(0, NO_NVML, "cpu")
GPU_NODE = rules.CudaPresence(1, "", "cuda")


def test_a_node_without_cuda_is_said_in_one_line_with_nvmls_own_words_and_nothing_runs() -> None:
    device, line = rules.check_device("cuda", CPU_NODE)
    assert device is None
    assert line == (
        f"gpu-check: CUDA is absent here (NVML: {NO_NVML}; torch.cuda in the default runtime "
        "environment: it reports device cpu); nothing to check, exit 0"
    )


@pytest.mark.parametrize(
    ("presence", "missing"),
    [
        # The driver is there but the runtime environment's torch is a CPU build: still absent.
        (rules.CudaPresence(2, "", "cpu"), "torch.cuda in the default runtime environment"),
        # torch says CUDA but NVML cannot read it: the reclaim could not be proved, so absent.
        (rules.CudaPresence(0, "NVML not installed", "cuda"), "NVML: NVML not installed"),
        (
            rules.CudaPresence(1, "", "", "python executable '/x' does not exist"),
            "it is unavailable (python executable '/x' does not exist)",
        ),
    ],
)
def test_cuda_needs_both_nvml_and_torch_in_the_runtime_environment(
    presence: rules.CudaPresence, missing: str
) -> None:
    device, line = rules.check_device("cuda:0", presence)
    assert device is None
    assert missing in line


def test_a_cuda_node_runs_on_the_device_asked_for() -> None:
    assert rules.check_device("cuda:1", GPU_NODE)[0] == "cuda:1"
    assert rules.cuda_absent_because(GPU_NODE) == ""


def test_cpu_runs_the_same_sequence_whatever_the_node_has() -> None:
    assert rules.check_device("cpu", CPU_NODE)[0] == "cpu"
    assert rules.check_device("cpu", GPU_NODE)[0] == "cpu"


def test_vram_back_within_the_slack_is_reclaimed() -> None:
    verdict, text = rules.reclaim_verdict(
        rules.Reclaim(before_load=1000 * MIB, loaded=1700 * MIB, after_unload=1010 * MIB)
    )
    assert verdict is True
    assert text == (
        "reclaim by NVML: RECLAIMED: NVML device used 1000 MiB before the load, 1700 MiB loaded "
        "(+700 MiB), 1010 MiB after the unload (+10 MiB), within 64 MiB"
    )


def test_vram_still_held_after_the_unload_is_not_reclaimed_and_fails_the_check() -> None:
    reading = rules.Reclaim(before_load=1000 * MIB, loaded=1700 * MIB, after_unload=1500 * MIB)
    verdict, text = rules.reclaim_verdict(reading)
    assert verdict is False
    assert "NOT RECLAIMED" in text and "(+500 MiB)" in text
    assert not rules.passed(_report(reclaim=reading))


def test_the_slack_is_the_bound_not_a_hair_over_it() -> None:
    at = rules.Reclaim(0, 500 * MIB, rules.RECLAIM_SLACK_BYTES)
    over = rules.Reclaim(0, 500 * MIB, rules.RECLAIM_SLACK_BYTES + 1)
    assert rules.reclaim_verdict(at)[0] is True
    assert rules.reclaim_verdict(over)[0] is False


def test_without_nvml_readings_the_reclaim_is_not_available_never_zero() -> None:
    reading = rules.Reclaim(None, None, None, "the check ran on cpu, not on a GPU")
    verdict, text = rules.reclaim_verdict(reading)
    assert verdict is None
    assert text == "reclaim by NVML: not available (the check ran on cpu, not on a GPU)"
    assert rules.passed(_report(reclaim=reading))


def _model(capability: str) -> rules.ModelFigures:
    return rules.ModelFigures(
        capability=capability,
        device="cuda",
        probe_rss_peak=900 * MIB,
        probe_cuda_peak=120 * MIB,
        probe_nvml_process=610 * MIB,
        charge_ram=900 * MIB,
        charge_vram=120 * MIB,
        resident_nvml_process=600 * MIB,
    )


def _report(
    *,
    reclaim: rules.Reclaim | None = None,
    models: tuple[rules.ModelFigures, ...] = (_model("minilm"), _model("minilm-2")),
    failures: tuple[str, ...] = (),
) -> rules.Report:
    return rules.Report(
        device="cuda",
        device_name="NVIDIA H100 80GB HBM3",
        seconds=151.4,
        models=models,
        reclaim=reclaim or rules.Reclaim(1000 * MIB, 1620 * MIB, 1004 * MIB),
        serving=rules.Serving(
            direct_p50_ms=4.0, gantry_p50_ms=5.25, direct_per_s=3200.0, gantry_per_s=2880.0
        ),
        failures=failures,
    )


def test_the_report_is_one_block_each_figure_beside_what_it_is_compared_with() -> None:
    assert rules.format_report(_report()) == [
        "gpu-check report: device cuda (NVIDIA H100 80GB HBM3), 151 s",
        "  minilm on cuda:",
        "    probe peaks: RSS 900 MiB, CUDA allocator 120 MiB, NVML process 610 MiB",
        "    charged by placement: RAM 900 MiB, VRAM 120 MiB; resident host by NVML 600 MiB",
        "  minilm-2 on cuda:",
        "    probe peaks: RSS 900 MiB, CUDA allocator 120 MiB, NVML process 610 MiB",
        "    charged by placement: RAM 900 MiB, VRAM 120 MiB; resident host by NVML 600 MiB",
        "  reclaim by NVML: RECLAIMED: NVML device used 1000 MiB before the load, 1620 MiB loaded "
        "(+620 MiB), 1004 MiB after the unload (+4 MiB), within 64 MiB",
        "  serving vs direct encode on cuda, one sentence: direct p50 4.00 ms, Gantry p50 "
        "5.25 ms (+1.25 ms)",
        "  throughput: direct batch-32 3200 sentences/s, 32 concurrent clients via Gantry "
        "2880/s = 0.90 of direct; errors none",
        "gpu-check: PASS",
    ]


def test_a_step_that_did_not_finish_is_named_and_fails_the_report() -> None:
    report = _report(
        models=(_model("minilm"),), failures=("the 300 s budget ran out during: minilm-2",)
    )
    lines = rules.format_report(report)
    assert "  FAILED: the 300 s budget ran out during: minilm-2" in lines
    assert lines[-1] == "gpu-check: FAIL"


def test_one_model_measured_is_not_a_pass_even_without_a_failure_named() -> None:
    assert not rules.passed(_report(models=(_model("minilm"),)))


def _no_cuda() -> bool:
    return False


def _cuda() -> bool:
    return True


@pytest.mark.parametrize(
    ("requested", "cuda", "chosen"),
    [
        ("cpu", _cuda, "cpu"),
        ("auto", _cuda, "cuda"),
        ("auto", _no_cuda, "cpu"),
        ("cuda", _cuda, "cuda"),
        ("cuda:1", _cuda, "cuda:1"),
    ],
)
def test_make_bench_measures_on_the_device_asked_for(
    requested: str, cuda: Callable[[], bool], chosen: str
) -> None:
    assert resolve_device(requested, cuda) == chosen


def test_make_bench_cuda_without_cuda_is_refused_not_measured_on_the_cpu() -> None:
    with pytest.raises(BenchDeviceError, match="torch sees no CUDA device"):
        resolve_device("cuda", _no_cuda)


@pytest.mark.parametrize("text", ["gpu", "cuda:", "cuda:x", "CPU"])
def test_make_bench_names_a_device_that_is_not_one(text: str) -> None:
    with pytest.raises(BenchDeviceError, match="is not one of auto, cpu, cuda, cuda:N"):
        resolve_device(text, _cuda)


def test_make_bench_is_on_the_cpu_unless_told_and_never_asks_torch_for_it() -> None:
    def asked() -> bool:
        raise AssertionError("cpu needs no CUDA probe")

    assert bench_device({}, asked) == "cpu"
    assert bench_device({DEVICE_ENV: "cpu"}, asked) == "cpu"
    assert bench_device({DEVICE_ENV: "auto"}, _cuda) == "cuda"

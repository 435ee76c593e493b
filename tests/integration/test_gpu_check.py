"""`make gpu-check` (tests/bench/gpu_check.py) as it runs, in a process of its own.

Here there is no CUDA: the default run must say so in one line and succeed, and `--device cpu`
must run the whole GPU sequence on the CPU against a real `gantry up` (its own processes, SQLite,
the bundled model through every gate, a second model beside it, an unload, the serving bench),
so the code a GPU node runs is run here too. What it decides is unit-tested in
tests/unit/test_gpu_check_rules.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gantry.worker.nvml_readings import Nvml

REPO_ROOT = Path(__file__).resolve().parents[2]


def _gpu_check(*args: str, timeout_s: float, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.bench.gpu_check", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **env},
        check=False,
    )


def _nvml_reason() -> str:
    nvml = Nvml.open()
    try:
        return "" if nvml.available else nvml.unavailable_reason
    finally:
        nvml.close()


@pytest.mark.timeout(120)
def test_without_cuda_it_says_so_in_one_line_with_nvmls_reason_and_exits_0() -> None:
    reason = _nvml_reason()
    if not reason:
        pytest.skip("NVML works on this node: the check runs its GPU sequence here")
    done = _gpu_check(timeout_s=90)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"gpu-check: CUDA is absent here (NVML: {reason}; torch.cuda in the default runtime "
        "environment: it reports device cpu); nothing to check, exit 0"
    ]
    assert "Traceback" not in done.stderr


def test_a_device_that_is_not_one_is_a_usage_error() -> None:
    done = _gpu_check("--device", "gpu", timeout_s=60)
    assert done.returncode == 2
    assert "'gpu' is not one of auto, cpu, cuda or cuda:N" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.timeout(300)
def test_on_the_cpu_the_whole_sequence_runs_and_reports_both_models() -> None:
    # Few serving iterations: the figures are not what this test is about.
    done = _gpu_check("--device", "cpu", timeout_s=280, GANTRY_GPU_CHECK_ITERATIONS="10")
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    start = next(i for i, line in enumerate(lines) if line.startswith("gpu-check report:"))
    report = lines[start:]
    assert report[0].startswith("gpu-check report: device cpu, ")
    assert "  minilm on cpu:" in report
    assert "  minilm-2 on cpu:" in report
    charged = [line for line in report if "charged by placement: RAM" in line]
    assert len(charged) == 2
    # The probe's RSS peak is what placement charges (the estimate `gantry up` gives is 0).
    assert all("placement: RAM 0 MiB" not in line for line in charged)
    assert "  reclaim by NVML: not available (the check ran on cpu, not on a GPU)" in report
    assert any(line.startswith("  serving vs direct encode on cpu") for line in report)
    assert any("errors none" in line for line in report)
    assert report[-1] == "gpu-check: PASS"
    # Progress before the report: each step said as it starts.
    assert any("minilm-2 answered Embed; unloading it" in line for line in lines)


@pytest.mark.timeout(120)
def test_out_of_budget_it_fails_naming_the_step_and_leaves_nothing_running() -> None:
    # 6 s: long enough for `gantry up` to start and take its SIGTERM on a loaded machine (at 3 s
    # a fresh clone's suite once ended it before it had written a line), far short of its first
    # Embed (about 18 s here).
    done = _gpu_check("--device", "cpu", timeout_s=100, GANTRY_GPU_CHECK_BUDGET_S="6")
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "  FAILED: the 6 s budget ran out during: `gantry up --device cpu` (inspect, probe, "
        "approve, deploy, load, Embed)" in lines
    )
    assert lines[-1] == "gpu-check: FAIL"
    [kept] = [line.rpartition(": ")[2] for line in lines if "kept its state and logs" in line]
    assert "Traceback" not in done.stderr
    # `gantry up` was told to stop (SIGTERM: it stops what it started), not abandoned.
    assert "gantry: shutting down" in (Path(kept) / "gantry-up.log").read_text()
    assert _processes_naming(kept) == []
    shutil.rmtree(kept)


def _processes_naming(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # it exited meanwhile
        if text in args:
            found.append(args)
    return found


def test_make_bench_refuses_a_device_that_is_not_one_before_measuring_anything() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.bench.run"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GANTRY_BENCH_DEVICE": "gpu"},
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""  # not one figure measured first
    assert done.stderr.splitlines() == [
        "make bench: GANTRY_BENCH_DEVICE='gpu' is not one of auto, cpu, cuda, cuda:N"
    ]

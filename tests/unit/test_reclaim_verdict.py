"""The one reclaim rule a probe's child and a serving resident's are judged by
(`runtime_adapters.reclaim_verdict`): reaped, and on a GPU NVML read and no longer listing it."""

from __future__ import annotations

import pytest

from gantry.worker.runtime_adapters.reclaim_verdict import is_gpu_device, reclaim_verdict


def test_a_reaped_cpu_process_is_verified_without_nvml() -> None:
    verdict = reclaim_verdict(process_exited=True, reaped=True, on_gpu=False, nvml_listed=None)
    assert verdict.verified
    assert verdict.why == "reaped, and it never held device memory (CPU)"


def test_a_reaped_gpu_process_nvml_still_lists_is_unverified() -> None:
    verdict = reclaim_verdict(process_exited=True, reaped=True, on_gpu=True, nvml_listed=True)
    assert not verdict.verified
    assert verdict.why == "NVML still lists the pid"


def test_a_gpu_process_with_nvml_unreadable_is_unverified() -> None:
    verdict = reclaim_verdict(process_exited=True, reaped=True, on_gpu=True, nvml_listed=None)
    assert not verdict.verified
    assert "NVML could not be read" in verdict.why


def test_a_reaped_gpu_process_nvml_no_longer_lists_is_verified() -> None:
    verdict = reclaim_verdict(process_exited=True, reaped=True, on_gpu=True, nvml_listed=False)
    assert verdict.verified


@pytest.mark.parametrize("on_gpu", [False, True])
@pytest.mark.parametrize(("exited", "reaped"), [(False, False), (True, False), (False, True)])
def test_nothing_is_verified_before_the_process_is_exited_and_reaped(
    on_gpu: bool, exited: bool, reaped: bool
) -> None:
    verdict = reclaim_verdict(
        process_exited=exited, reaped=reaped, on_gpu=on_gpu, nvml_listed=False
    )
    assert not verdict.verified


def test_a_cpu_process_nvml_lists_is_unverified() -> None:
    # Its profile said CPU, yet the driver holds memory for it: NVML wins.
    verdict = reclaim_verdict(process_exited=True, reaped=True, on_gpu=False, nvml_listed=True)
    assert not verdict.verified


@pytest.mark.parametrize(
    ("device", "gpu"), [("cuda", True), ("cuda:1", True), ("cpu", False), ("", False)]
)
def test_which_devices_are_gpus(device: str, gpu: bool) -> None:
    assert is_gpu_device(device) is gpu

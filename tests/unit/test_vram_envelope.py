"""What a CUDA profile charges: the probe's measured peak (NVML's per-process figure or the
allocator's peak, whichever is larger) plus the documented margin, never below the operator's
estimate; and a CUDA profile whose VRAM is unknown is refused VRAM_UNMEASURED, never charged 0."""

from __future__ import annotations

import grpc
import pytest

from gantry.common.errors import FailureClass
from gantry.controlplane.deployments.requirements import (
    residency_charge,
    unmeasured_vram,
)
from gantry.controlplane.evidence.envelope import (
    MIB,
    VRAM_MARGIN_BYTES,
    profile_envelope,
    vram_with_margin,
)
from gantry.controlplane.evidence.job_plans import (
    ProbeResultSnapshot,
    measured_vram_peak,
    plan_probe_result,
)
from gantry.controlplane.jobs import actions as act
from gantry.controlplane.platform.models import RuntimeProfile
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg

GIB = 1024 * MIB
CUDA0 = common_pb2.AdapterSettings(device="cuda:0")


def _profile(*, vram: int = 0, vram_peak: int | None = None) -> RuntimeProfile:
    return RuntimeProfile(
        ram_estimate_bytes=GIB,
        vram_estimate_bytes=vram,
        ram_measured_peak_bytes=None,
        vram_measured_peak_bytes=vram_peak,
    )


def _bytes(value: int) -> common_pb2.Measurement:
    return common_pb2.Measurement(bytes=value, source="test")


def _unavailable(why: str) -> common_pb2.Measurement:
    return common_pb2.Measurement(unavailable=why, source="test")


def test_the_margin_is_ten_percent_of_the_peak_plus_256_mib() -> None:
    assert VRAM_MARGIN_BYTES == 256 * MIB
    assert vram_with_margin(10 * GIB) == 11 * GIB + 256 * MIB
    assert vram_with_margin(0) == 256 * MIB  # a measured 0 is still known, and charged


def test_a_measured_peak_is_charged_with_its_margin_above_a_smaller_estimate() -> None:
    assert profile_envelope(_profile(vram=4 * GIB, vram_peak=6 * GIB)) == (
        GIB,
        vram_with_margin(6 * GIB),
    )
    assert profile_envelope(_profile(vram_peak=6 * GIB))[1] == vram_with_margin(6 * GIB)


def test_the_charge_is_never_below_the_estimate() -> None:
    # A probe that ran light never shrinks a generous estimate, margin included.
    assert profile_envelope(_profile(vram=20 * GIB, vram_peak=6 * GIB))[1] == 20 * GIB
    assert profile_envelope(_profile(vram=20 * GIB))[1] == 20 * GIB


def test_no_estimate_and_nothing_measured_is_an_unknown_vram_of_zero() -> None:
    assert profile_envelope(_profile()) == (GIB, 0)


def test_the_measured_peak_is_the_larger_of_nvml_and_the_allocator() -> None:
    # NVML holds the CUDA context and the allocator's reserve: larger as a rule.
    both = wg.MemoryEvidence(nvml_process_used=_bytes(900), cuda_peak_allocated=_bytes(600))
    assert measured_vram_peak(both) == 900
    # The allocator's peak may pass NVML's single sample (memory handed back before it read).
    sampled_late = wg.MemoryEvidence(nvml_process_used=_bytes(500), cuda_peak_allocated=_bytes(700))
    assert measured_vram_peak(sampled_late) == 700
    nvml_only = wg.MemoryEvidence(
        nvml_process_used=_bytes(900), cuda_peak_allocated=_unavailable("device is cpu")
    )
    assert measured_vram_peak(nvml_only) == 900
    allocator_only = wg.MemoryEvidence(
        nvml_process_used=_unavailable("NVML: no library"), cuda_peak_allocated=_bytes(600)
    )
    assert measured_vram_peak(allocator_only) == 600


def test_nothing_measured_is_no_peak_not_zero() -> None:
    neither = wg.MemoryEvidence(
        nvml_process_used=_unavailable("NVML: no library"),
        cuda_peak_allocated=_unavailable("device is cpu"),
    )
    assert measured_vram_peak(neither) is None
    assert measured_vram_peak(wg.MemoryEvidence()) is None


def test_a_probes_result_records_the_larger_peak_for_its_profile() -> None:
    evidence = wg.ProbeEvidence(
        memory=wg.MemoryEvidence(
            rss_peak=_bytes(1000),
            cuda_peak_allocated=_bytes(3 * GIB),
            nvml_process_used=_bytes(4 * GIB),
        )
    )
    snapshot = ProbeResultSnapshot(
        probe_id="p1",
        ended=False,
        profile_id="pf1",
        artifact_set_id="as1",
        node_id="n1",
        result=wg.JobResult(probe=evidence),
    )
    [recorded] = plan_probe_result(snapshot)
    assert isinstance(recorded, act.RecordProbeEvidence)
    assert (recorded.ram_peak_bytes, recorded.vram_peak_bytes) == (1000, 4 * GIB)


def test_a_cuda_profile_with_unknown_vram_is_refused_vram_unmeasured() -> None:
    charge = residency_charge(CUDA0, profile_envelope(_profile()))
    refusal = unmeasured_vram(charge)
    assert refusal is not None
    assert refusal.reason == "VRAM_UNMEASURED"
    assert refusal.metadata == {"device": "cuda:0"}
    assert "VRAM is unknown" in refusal.message
    assert (refusal.code, refusal.failure_class) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        FailureClass.CONFIG,
    )


@pytest.mark.parametrize(
    ("adapter", "profile"),
    [
        (CUDA0, _profile(vram=GIB)),  # estimated
        (CUDA0, _profile(vram_peak=0)),  # measured, however small
        (common_pb2.AdapterSettings(device="cpu"), _profile()),  # no GPU: no VRAM to know
    ],
)
def test_a_known_vram_or_a_cpu_profile_is_placed(
    adapter: common_pb2.AdapterSettings, profile: RuntimeProfile
) -> None:
    assert unmeasured_vram(residency_charge(adapter, profile_envelope(profile))) is None

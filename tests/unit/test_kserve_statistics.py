"""Triton's model statistics from the control plane's per-capability tally (platform/call_tally.py,
kserve/service.py's statistics_of, rest.py's spelling), and the RPCs and REST paths that are not
served: each one named, each answering UNIMPLEMENTED with the served list."""

from __future__ import annotations

import grpc
import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.platform.call_tally import CallTally, CapabilityCalls
from gantry.controlplane.serving.kserve import rest
from gantry.controlplane.serving.kserve.service import (
    SERVED,
    UNSERVED,
    KServeInference,
    statistics_of,
    unserved,
)
from gantry.kserve import grpc_service_pb2 as kserve


def test_the_tally_sums_successes_and_failures_apart_per_capability() -> None:
    tally = CallTally()
    tally.record("embed", ok=True, seconds=0.5, now_ms=1_000)
    tally.record("embed", ok=True, seconds=0.25, now_ms=3_000)
    tally.record("embed", ok=False, seconds=0.125, now_ms=2_000)  # answered out of order
    tally.record("rerank", ok=False, seconds=1.0, now_ms=500)

    assert tally.of("embed") == CapabilityCalls(
        success_count=2,
        success_ns=750_000_000,
        fail_count=1,
        fail_ns=125_000_000,
        last_answered_ms=3_000,
    )
    assert tally.of("rerank") == CapabilityCalls(
        fail_count=1, fail_ns=1_000_000_000, last_answered_ms=500
    )
    assert tally.of("never-called") == CapabilityCalls()


def test_the_tally_is_bounded_in_capabilities_not_in_calls() -> None:
    tally = CallTally(limit=2)
    for capability in ("a", "b", "c"):
        tally.record(capability, ok=True, seconds=0.0, now_ms=1)
    tally.record("a", ok=True, seconds=0.0, now_ms=2)
    assert tally.of("c") == CapabilityCalls()  # past the bound: not tallied
    assert tally.of("a").success_count == 2


def test_statistics_are_triton_shaped_in_grpc_and_rest() -> None:
    calls = CapabilityCalls(
        success_count=3, success_ns=30, fail_count=1, fail_ns=7, last_answered_ms=1_700
    )
    stats = statistics_of("embed", calls)
    assert (stats.name, stats.last_inference, stats.inference_count, stats.execution_count) == (
        "embed",
        1_700,
        3,
        3,
    )
    assert (stats.inference_stats.success.count, stats.inference_stats.success.ns) == (3, 30)
    assert (stats.inference_stats.fail.count, stats.inference_stats.fail.ns) == (1, 7)

    document = rest.model_statistics(kserve.ModelStatisticsResponse(model_stats=[stats]))
    assert document == {
        "model_stats": [
            {
                "name": "embed",
                "version": "",
                "last_inference": 1_700,
                "inference_count": 3,
                "execution_count": 3,
                "inference_stats": {
                    "success": {"count": 3, "ns": 30},
                    "fail": {"count": 1, "ns": 7},
                },
            }
        ]
    }


def test_served_and_unserved_split_the_service_descriptor() -> None:
    methods = {m.name for m in kserve.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods}
    assert set(SERVED) | set(UNSERVED) == methods and not set(SERVED) & set(UNSERVED)
    assert {"RepositoryModelLoad", "SystemSharedMemoryRegister", "LogSettings"} <= set(UNSERVED)
    for method in UNSERVED:
        assert getattr(KServeInference, method).__name__ == method


@pytest.mark.parametrize("method", UNSERVED)
async def test_each_unserved_rpc_answers_unimplemented_with_the_served_list(method: str) -> None:
    answer = getattr(KServeInference, method)
    with pytest.raises(GantryError) as caught:
        await answer(None, kserve.Unserved(), None)
    error = caught.value
    assert (error.reason, error.code) == ("UNIMPLEMENTED", grpc.StatusCode.UNIMPLEMENTED)
    assert error.metadata == {"method": method, "served": ",".join(SERVED)}


def test_every_unserved_rpc_has_its_triton_rest_paths() -> None:
    assert {rpc for _, _, rpc in rest.UNSERVED_PATHS} == set(UNSERVED)
    assert all(path.startswith("/v2/") for _, path, _ in rest.UNSERVED_PATHS)


def test_an_unimplemented_rest_error_lists_what_is_served() -> None:
    refused = rest.rest_error(unserved("LogSettings"), 501)
    assert refused.status == 501 and refused.headers == {rest.REASON_HEADER: "UNIMPLEMENTED"}
    assert refused.body["code"] == "UNIMPLEMENTED"
    assert refused.body["served"] == list(SERVED)
    assert refused.body["error"].startswith("LogSettings is not served")

"""CUDA out of memory, typed and counted: the reasons in the one errors table, the model host's
reading of torch's error, and how the scheduler's breakers and the degradation signal count an
INVOKE_OOM (through its class, against an INVOKE_FAILED that must count otherwise). The real
child's path is tests/integration/test_model_host_cuda_oom.py."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gantry.common.clock import ManualClock
from gantry.common.errors import REASONS, FailureClass, GantryError
from gantry.controlplane.jobs.result_plans import load_gives_up
from gantry.controlplane.serving.capability_degradation import (
    SUCCESS_RATE_LOW,
    CapabilityDegradation,
    Condition,
    DegradationSettings,
)
from gantry.controlplane.serving.inference_calls import (
    CallBudget,
    degradation_outcome,
    work_outcome,
)
from gantry.scheduler.policy.core import CoreSettings, SchedulerCore
from gantry.scheduler.policy.events import Dispatched, WorkRejected
from gantry.scheduler.policy.types import Outcome
from gantry.v1 import scheduler_pb2
from gantry.worker.model_host import cuda_oom
from gantry.worker.model_host.memory_readings import CudaAllocator
from tests.unit.test_scheduler_core import cluster, residency, work

SERVER_CAPPED = CallBudget(seconds=30.0, client_bounded=False)
CLIENT_BOUNDED = CallBudget(seconds=1.0, client_bounded=True)
TORCH_2_MESSAGE = (
    "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 14.75 GiB "
    "of which 3.06 MiB is free. Process 4242 has 14.74 GiB memory in use. Of the allocated "
    "memory 14.57 GiB is allocated by PyTorch, and 40.46 MiB is reserved by PyTorch but "
    "unallocated."
)
TORCH_1_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity; "
    "12.21 GiB already allocated; 1.12 GiB free; 13.41 GiB reserved in total by PyTorch)"
)
MIB, GIB = 1024**2, 1024**3


def test_both_oom_reasons_are_config_and_resource_exhausted_in_the_one_table() -> None:
    for reason in ("RUNTIME_OOM", "INVOKE_OOM"):
        assert REASONS[reason].failure_class is FailureClass.CONFIG
        assert REASONS[reason].code is grpc.StatusCode.RESOURCE_EXHAUSTED
    # The kernel's OOM killer ending the host is another matter: the host is gone (INFRA).
    assert REASONS["RUNTIME_OOM_KILLED"].failure_class is FailureClass.INFRA


def test_a_load_that_ran_out_of_cuda_memory_is_not_retried() -> None:
    # The envelope was wrong: the same load on the same envelope cannot fit, unlike a crash.
    assert load_gives_up("RUNTIME_OOM", load_failure_count=1, origin="pipeline")
    assert not load_gives_up("LOAD_FAILED", load_failure_count=1, origin="pipeline")


def test_torch_oom_messages_give_their_figures_in_bytes() -> None:
    assert cuda_oom.figures_of(TORCH_2_MESSAGE) == {
        "cuda_tried_to_allocate_bytes": str(20 * MIB),
        "cuda_total_bytes": str(int(14.75 * GIB)),
        "cuda_free_bytes": str(int(3.06 * MIB)),
    }
    assert cuda_oom.figures_of(TORCH_1_MESSAGE) == {
        "cuda_tried_to_allocate_bytes": str(2 * GIB),
        "cuda_total_bytes": str(int(15.78 * GIB)),
        "cuda_free_bytes": str(int(1.12 * GIB)),
    }
    assert cuda_oom.figures_of("CUDA error: an illegal memory access") == {}


def test_only_torchs_cuda_oom_is_one() -> None:
    import torch

    assert cuda_oom.is_cuda_oom(torch.cuda.OutOfMemoryError(TORCH_2_MESSAGE))
    assert not cuda_oom.is_cuda_oom(RuntimeError(TORCH_2_MESSAGE))  # its words are not enough
    assert not cuda_oom.is_cuda_oom(MemoryError())  # the host's own RAM: not the allocator's


def test_invoke_oom_carries_the_figures_but_not_torchs_words() -> None:
    import torch

    error = cuda_oom.invoke_oom(torch.cuda.OutOfMemoryError(TORCH_2_MESSAGE), CudaAllocator("cpu"))
    assert error.reason == "INVOKE_OOM"
    assert "Process 4242" not in error.message  # another process on the device, not the client's
    assert "tried to allocate 20.0 MiB" in error.message
    assert error.metadata["cuda_tried_to_allocate_bytes"] == str(20 * MIB)
    assert error.metadata["cuda_peak_allocated"] == "unavailable: device is cpu"
    load = cuda_oom.load_oom(torch.cuda.OutOfMemoryError(TORCH_1_MESSAGE), CudaAllocator("cpu"))
    assert load.reason == "RUNTIME_OOM"
    assert load.metadata["cuda_free_bytes"] == str(int(1.12 * GIB))


def test_an_invoke_oom_is_answered_work_for_the_scheduler_and_a_failure_for_degradation() -> None:
    oom = GantryError("INVOKE_OOM", "too large")
    assert work_outcome(oom, SERVER_CAPPED) == scheduler_pb2.WORK_OUTCOME_REQUEST_FAILURE
    assert degradation_outcome(oom, SERVER_CAPPED) is False
    # Against the other classes: a runtime failure counts in both, a bad request in neither.
    failed = GantryError("INVOKE_FAILED", "raised")
    assert work_outcome(failed, SERVER_CAPPED) == scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE
    assert degradation_outcome(failed, SERVER_CAPPED) is False
    assert degradation_outcome(GantryError("INVALID_PAYLOAD", "bad"), SERVER_CAPPED) is None
    assert degradation_outcome(None, SERVER_CAPPED) is True
    assert degradation_outcome(asyncio.CancelledError(), SERVER_CAPPED) is None
    late = GantryError("DEADLINE_EXCEEDED", "late")
    assert degradation_outcome(late, CLIENT_BOUNDED) is None
    assert degradation_outcome(late, SERVER_CAPPED) is False


def _finish_failures(core: SchedulerCore, error: GantryError, count: int) -> list[object]:
    """`count` calls dispatched and failed with `error`, counted as the control plane counts them
    (its class's outcome, its reason); the decisions of the call submitted after them."""
    outcome = Outcome(work_outcome(error, SERVER_CAPPED))
    for i in range(count):
        decisions = core.submit(work(f"{error.reason}-{i}"), 0.0)
        (sent,) = [d for d in decisions if isinstance(d, Dispatched)]
        core.finish(sent.work_id, outcome, 0.0, reason=error.reason)
    return core.submit(work(f"{error.reason}-after"), 0.0)


@pytest.mark.parametrize(("reason", "opens"), [("INVOKE_OOM", False), ("INVOKE_FAILED", True)])
def test_the_breaker_reads_the_reasons_class(reason: str, opens: bool) -> None:
    core = SchedulerCore(CoreSettings(breaker_threshold=3))
    cluster(core, residencies=[residency("r1")])
    after = _finish_failures(core, GantryError(reason, "x"), 3)
    refused = [d.reason for d in after if isinstance(d, WorkRejected)]
    assert refused == (["CIRCUIT_OPEN"] if opens else [])


def test_repeated_invoke_ooms_degrade_the_capability() -> None:
    policy = CapabilityDegradation(
        ManualClock(), DegradationSettings(window_s=60, min_outcomes=4, min_success_rate=0.75)
    )
    outcomes = [None, GantryError("INVOKE_OOM", "x"), GantryError("INVOKE_OOM", "x"), None]
    for error in outcomes:
        counted = degradation_outcome(error, SERVER_CAPPED)
        assert counted is not None
        policy.record("embed", succeeded=counted)
    (degraded,) = policy.evaluate()
    assert (degraded.condition, degraded.reason) == (Condition.DEGRADED, SUCCESS_RATE_LOW)

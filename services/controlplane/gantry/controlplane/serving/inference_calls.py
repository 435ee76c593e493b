"""What every Inference call shares, whatever its payload: the settings, the call's time budget, how
its outcome counts for the scheduler, the operation it is counted as, and its counted answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from gantry.common import operations
from gantry.common.errors import GantryError
from gantry.common.inference_limits import InferenceLimits
from gantry.controlplane.nodes.sessions import DEFAULT_PROGRESS_LIMIT, InvokePayload, NoStreamHere
from gantry.controlplane.platform import metrics
from gantry.controlplane.serving.routing import TargetedRequest
from gantry.v1 import common_pb2, scheduler_pb2

_Answer = TypeVar("_Answer")

DEFAULT_MAX_INVOKE_SECONDS = 300.0
# How a failed call counts, by its reason's class in the errors table (the one declaration):
# the scheduler's outcome (its breakers open on INFRA alone: a host that answered, however it
# failed the call, is not broken) and whether the capability's degradation signal counts it. A
# CONFIG failure at invoke (INVOKE_OOM: the envelope too small for a call the deployment's
# limits admit) opens no breaker, yet says the capability fails what it accepts: it degrades.
_OUTCOME_BY_CLASS = {
    common_pb2.FAILURE_CLASS_INFRA: scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE,
    common_pb2.FAILURE_CLASS_REQUEST: scheduler_pb2.WORK_OUTCOME_REQUEST_FAILURE,
    common_pb2.FAILURE_CLASS_CONFIG: scheduler_pb2.WORK_OUTCOME_REQUEST_FAILURE,
}
_DEGRADES_BY_CLASS = {
    common_pb2.FAILURE_CLASS_INFRA: True,
    common_pb2.FAILURE_CLASS_REQUEST: False,
    common_pb2.FAILURE_CLASS_CONFIG: True,
}
# Outcomes that say something about the runtime (a bad request or a client that left does not).
RUNTIME_OUTCOMES = (scheduler_pb2.WORK_OUTCOME_SUCCESS, scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE)


def operation_of(payload: InvokePayload) -> str:
    """The RPC a payload is sent for, as the metrics name it (the registry's `of_payload`: a
    generation's two RPCs differ in `stream`)."""
    return operations.of_payload(payload).rpc


class Resolve(Protocol):
    """InferenceService._resolve: capability | deployment_id -> a routable deployment, the
    stage counted under `operation` (an RPC name)."""

    def __call__(self, operation: str, request: TargetedRequest) -> Awaitable[str]: ...


@dataclass(frozen=True, kw_only=True)
class InferenceSettings:
    # The server's own bound on one call, applied only when the client asks for longer or sets
    # no deadline: a client that asks for 120 s gets 120 s.
    max_invoke_seconds: float = DEFAULT_MAX_INVOKE_SECONDS
    limits: InferenceLimits = field(default_factory=InferenceLimits)
    # Streamed results (a GenerateStream's text) held for one caller that reads slower than its
    # model writes; past it the call fails with CLIENT_TOO_SLOW (worker_sessions).
    stream_backlog_limit: int = DEFAULT_PROGRESS_LIMIT


@dataclass(frozen=True, slots=True)
class CallBudget:
    """How long one call may take, and whose limit that is."""

    seconds: float
    client_bounded: bool  # the client's deadline, not the server cap, is the binding limit

    @classmethod
    def of(cls, client_remaining: float | None, *, max_seconds: float) -> CallBudget:
        if client_remaining is not None and client_remaining <= max_seconds:
            return cls(seconds=max(0.0, client_remaining), client_bounded=True)
        return cls(seconds=max_seconds, client_bounded=False)


def work_outcome(error: BaseException | None, budget: CallBudget) -> scheduler_pb2.WorkOutcome:
    """How finished work counts for the scheduler's health accounting; one place decides.

    A client that goes away is CANCELLED, never INFRA. A deadline that passes counts as INFRA
    (a timeout, per CONTRACTS.md) only when it was the server's own cap: a deadline the client
    chose says nothing about the residency, and counting it would let any client with tight
    deadlines trip breakers on healthy residencies. The client still sees DEADLINE_EXCEEDED.
    """
    if error is None:
        return scheduler_pb2.WORK_OUTCOME_SUCCESS
    if isinstance(error, asyncio.CancelledError | NoStreamHere):
        # NoStreamHere: this replica holds no stream to the node (it dials us yet, or holds
        # another replica's): the node is not at fault, and three of those must not open its
        # breaker for every replica.
        return scheduler_pb2.WORK_OUTCOME_CANCELLED
    if isinstance(error, GantryError):
        if error.reason == "DEADLINE_EXCEEDED" and budget.client_bounded:
            return scheduler_pb2.WORK_OUTCOME_CANCELLED
        return _OUTCOME_BY_CLASS[error.failure_class.value]
    return scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE


def degradation_outcome(error: BaseException | None, budget: CallBudget) -> bool | None:
    """How finished work counts for its capability's degradation signal: True a success, False a
    failure, None not at all (a bad request, a client gone or out of its own time)."""
    outcome = work_outcome(error, budget)
    if outcome == scheduler_pb2.WORK_OUTCOME_SUCCESS:
        return True
    if outcome == scheduler_pb2.WORK_OUTCOME_CANCELLED:
        return None
    if isinstance(error, GantryError):
        return False if _DEGRADES_BY_CLASS[error.failure_class.value] else None
    return False


async def counted(operation: str, answer: Awaitable[_Answer]) -> _Answer:
    """Await one call's answer and count it, whatever it is: the status and reason the client
    sees (validation errors included) and the whole call's latency, labelled with the model the
    call resolved to on the way (`metrics.call_resolved`), if it got that far."""
    started = time.perf_counter()
    with metrics.counting():
        return await await_reporting(
            answer,
            lambda error: metrics.invocation_answered(
                operation, error, time.perf_counter() - started
            ),
        )


async def await_reporting(
    answer: Awaitable[_Answer], report: Callable[[BaseException | None], object]
) -> _Answer:
    """Await `answer`, then hand `report` what it raised (None once it answered), whatever
    happened: a failure and a cancellation are reported too, and still raised."""
    error: BaseException | None = None
    try:
        return await answer
    except BaseException as failure:
        error = failure
        raise
    finally:
        report(error)

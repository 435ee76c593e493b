"""The scheduler link's silence rule: which ping endings mean nobody answered, and what a silent
scheduler does to waiting and new requests (no stream: the link's state is driven directly)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gantry.common import tokens
from gantry.common.errors import GantryError
from gantry.controlplane.platform.scheduler_link import LinkPhase, SchedulerLink
from gantry.controlplane.platform.scheduler_silence import Liveness, ping_answered
from gantry.v1 import scheduler_pb2
from tests.waiting import poll

TOKEN = tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler")


async def _no_state() -> scheduler_pb2.ClusterState:
    return scheduler_pb2.ClusterState()


def _connected_link() -> SchedulerLink:
    # Never started: nothing drains the outbox or resolves a request, so each stays waiting.
    link = SchedulerLink(address="127.0.0.1:1", service_token=TOKEN, cluster_state=_no_state)
    link._set_phase(LinkPhase.CONNECTED)
    return link


@pytest.mark.parametrize(
    ("code", "answered"),
    [
        (grpc.StatusCode.OK, True),
        # A server without the health service still answered: the process runs.
        (grpc.StatusCode.UNIMPLEMENTED, True),
        (grpc.StatusCode.UNAUTHENTICATED, True),
        (grpc.StatusCode.INTERNAL, True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, False),
        (grpc.StatusCode.UNAVAILABLE, False),
    ],
)
def test_only_a_ping_that_timed_out_or_found_no_transport_counts_as_unanswered(
    code: grpc.StatusCode, answered: bool
) -> None:
    assert ping_answered(code) is answered


async def test_silence_fails_the_waiting_request_and_refuses_new_ones_until_heard_again() -> None:
    link = _connected_link()
    assert link.connected and link.liveness is Liveness.ANSWERING
    waiting = asyncio.create_task(
        link.dispatch(scheduler_pb2.WorkSubmitted(work_id="w1"), timeout=600)
    )
    await poll(lambda: link.waiting == 1, 5, "the request queued, waiting for its answer")

    link._fell_silent(grpc.StatusCode.DEADLINE_EXCEEDED)
    with pytest.raises(GantryError) as failed:
        await waiting
    assert failed.value.reason == "SCHEDULER_UNAVAILABLE"
    assert link.liveness is Liveness.SILENT and not link.connected
    assert link.phase is LinkPhase.CONNECTED  # the stream is kept: nothing queued on it is lost

    with pytest.raises(GantryError) as refused:
        await link.dispatch(scheduler_pb2.WorkSubmitted(work_id="w2"), timeout=600)
    assert refused.value.reason == "SCHEDULER_UNAVAILABLE"
    with pytest.raises(GantryError) as no_snapshot:
        await link.queue_snapshot(timeout=600)
    assert no_snapshot.value.reason == "SCHEDULER_UNAVAILABLE"

    link._heard()
    assert link.connected and link.liveness is Liveness.ANSWERING
    await link.wait_connected(5)  # set already: returns at once


async def test_silence_outlives_a_reconnect_until_the_scheduler_answers() -> None:
    link = _connected_link()
    link._fell_silent(grpc.StatusCode.DEADLINE_EXCEEDED)
    link._set_phase(LinkPhase.DISCONNECTED)
    link._set_phase(LinkPhase.CONNECTED)  # a new stream to a process that may still be stopped
    assert not link.connected and not link._connected.is_set()
    link._heard()
    assert link.connected and link._connected.is_set()

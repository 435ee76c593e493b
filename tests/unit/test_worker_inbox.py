"""The model host's inbox: bounded work, control frames always accepted, cancels remembered."""

from __future__ import annotations

import queue

import pytest

from gantry.v1 import model_host_pb2, worker_gateway_pb2
from gantry.worker.model_host.inbox import ChannelClosed, Inbox, Queued, Woken


def _embed(request_id: int) -> Queued:
    request = model_host_pb2.HostRequest(
        request_id=request_id, embed=worker_gateway_pb2.EmbedPayload(inputs=["x"])
    )
    return Queued(request, None)


def test_work_past_the_limit_is_refused_but_shutdown_is_not() -> None:
    inbox = Inbox(limit=2)
    assert inbox.offer(_embed(1))
    assert inbox.offer(_embed(2))
    assert not inbox.offer(_embed(3))
    shutdown = Queued(model_host_pb2.HostRequest(shutdown=model_host_pb2.Shutdown()), None)
    assert inbox.offer(shutdown)
    taken = inbox.get(timeout=0)
    assert isinstance(taken, Queued) and taken.request.request_id == 1
    assert inbox.offer(_embed(4))  # taking one freed a slot


def test_cancelled_requests_are_remembered_once() -> None:
    inbox = Inbox(limit=2)
    inbox.cancel(7)
    assert inbox.take_cancelled(7)
    assert not inbox.take_cancelled(7)
    assert not inbox.take_cancelled(8)


def test_expiry_and_channel_close() -> None:
    expiring = Queued(_embed(1).request, expires_at=10.0)
    assert not expiring.expired(9.9)
    assert expiring.expired(10.0)
    assert not _embed(2).expired(1e9)
    inbox = Inbox(limit=1)
    inbox.close()
    assert isinstance(inbox.get(timeout=0), ChannelClosed)
    with pytest.raises(queue.Empty):
        inbox.get(timeout=0)


def test_control_frames_are_bounded_too():
    from gantry.v1 import model_host_pb2
    from gantry.worker.model_host.inbox import CONTROL_FRAME_LIMIT, Inbox, Queued

    inbox = Inbox(limit=1)
    ping = Queued(model_host_pb2.HostRequest(ping=model_host_pb2.Ping()), None)
    accepted = sum(inbox.offer(ping) for _ in range(CONTROL_FRAME_LIMIT + 5))
    assert accepted == CONTROL_FRAME_LIMIT + 1  # the idle work slot's room included
    inbox.close()  # the close marker still fits


def test_a_wake_ends_a_wait_for_it_and_any_other_get_passes_over_it() -> None:
    inbox = Inbox(limit=2)
    inbox.wake()  # nobody waited: a plain get takes the work behind it
    assert inbox.offer(_embed(1))
    taken = inbox.get(timeout=0)
    assert isinstance(taken, Queued) and taken.request.request_id == 1
    with pytest.raises(queue.Empty):
        inbox.get(timeout=0)

    inbox.wake()
    assert isinstance(inbox.get_or_woken(), Woken)
    assert inbox.offer(_embed(2))
    taken = inbox.get_or_woken()
    assert isinstance(taken, Queued) and taken.request.request_id == 2
    assert inbox.offer(_embed(3)) and inbox.offer(_embed(4))  # taking 2 freed its slot

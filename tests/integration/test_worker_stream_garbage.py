"""Issue 26, item 9: garbage after a valid Hello on a real control plane. A raw gRPC client holding
a node credential sends a Hello, reads its Welcome, then bytes that are no WorkerMessage, or a
message with no kind this stream takes: the stream ends with INVALID_ARGUMENT and its ErrorInfo
(it ended with status OK before), the refusal is logged as one bounded line without a traceback,
and the node dials again and is welcomed as before."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gantry.common.auth import auth_metadata
from gantry.common.status import error_info_of
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import Harness, running_gantry

CONNECT = "/gantry.v1.WorkerGateway/Connect"
# A varint cut short: no protobuf message parses from it.
TRUNCATED = b"\xff\xff\xff"
# node_id (field 2, a string) holding bytes that are not UTF-8.
NOT_UTF8 = b"\x12\x02\xc3\x28"
# Only a field this control plane does not know (field 999, varint 1): it parses, with no kind.
UNKNOWN_FIELD_ONLY = b"\xb8\x3e\x01"


@pytest.fixture
async def gantry(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_gantry(sqlite_url, tmp_path / "artifacts") as harness:
        yield harness


def _raw_stream(harness: Harness, credential: str) -> grpc.aio.StreamStreamCall:
    """WorkerGateway.Connect with the request bytes written as given (no serializer)."""
    connect = harness.channel.stream_stream(
        CONNECT,
        request_serializer=lambda raw: raw,
        response_deserializer=wg.ControlMessage.FromString,
    )
    return connect(metadata=auth_metadata(credential))


async def _welcomed(call: grpc.aio.StreamStreamCall) -> wg.Welcome:
    await call.write(wg.WorkerMessage(hello=wg.Hello(hostname="raw")).SerializeToString())
    first = await call.read()
    assert isinstance(first, wg.ControlMessage) and first.WhichOneof("kind") == "welcome"
    return first.welcome


async def _status_after(call: grpc.aio.StreamStreamCall, garbage: bytes) -> grpc.aio.AioRpcError:
    """Send `garbage`, then read until the stream ends: its status (an OK end fails the test)."""
    await call.write(garbage)
    try:
        # A deadline for the test only: before the fix some of these streams never ended.
        async with asyncio.timeout(30):
            while await call.read() is not grpc.aio.EOF:
                pass  # what the control plane sent meanwhile (a pump pass)
    except grpc.aio.AioRpcError as ended:
        return ended
    raise AssertionError(f"the stream ended with {await call.code()}, not a refusal")


@pytest.mark.parametrize(
    ("garbage", "field"),
    [
        pytest.param(TRUNCATED, None, id="unparseable"),
        pytest.param(NOT_UTF8, None, id="not-utf8"),
        pytest.param(b"", "WorkerMessage.kind", id="empty"),
        pytest.param(UNKNOWN_FIELD_ONLY, "WorkerMessage.kind", id="unknown-field"),
        pytest.param(
            wg.WorkerMessage(hello=wg.Hello(hostname="again")).SerializeToString(),
            "WorkerMessage.kind",
            id="second-hello",
        ),
    ],
)
async def test_garbage_after_hello_ends_the_stream_invalid_argument(
    gantry: Harness, caplog: pytest.LogCaptureFixture, garbage: bytes, field: str | None
):
    credential = await gantry.register_node("garbled")
    call = _raw_stream(gantry, credential)
    await _welcomed(call)
    with caplog.at_level(logging.INFO):
        ended = await _status_after(call, garbage)
    assert ended.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info_of(ended)
    assert info is not None and info.reason == "INVALID_ARGUMENT"
    if field is not None:
        assert info.metadata["field"] == field
    assert "Traceback" not in (ended.details() or "")
    refusals = [r for r in caplog.records if "worker stream refused" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in caplog.records]
    assert not refusals[0].exc_info and len(refusals[0].getMessage()) < 1_000
    assert not any(r.exc_info for r in caplog.records if r.name.startswith("gantry"))
    # The node is served again: a new stream is welcomed.
    again = _raw_stream(gantry, credential)
    assert (await _welcomed(again)).node_id
    again.cancel()


async def test_garbage_as_the_first_message_is_refused_before_hello(gantry: Harness):
    credential = await gantry.register_node("garbled-first")
    call = _raw_stream(gantry, credential)
    ended = await _status_after(call, TRUNCATED)
    assert ended.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info_of(ended)
    assert info is not None and info.reason == "INVALID_ARGUMENT"

"""Length-prefixed frames on the model host pipe: round trips, truncation and the size limit."""

from __future__ import annotations

import asyncio
import io
import socket
import struct

import pytest

from gantry.v1 import model_host_pb2, worker_gateway_pb2
from gantry.worker.model_host.framing import (
    FrameError,
    FrameSender,
    encode_frame,
    read_frame,
    read_frame_async,
    write_frame,
)


def _embed_request(request_id: int, *inputs: str) -> model_host_pb2.HostRequest:
    return model_host_pb2.HostRequest(
        request_id=request_id,
        trace_context={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
        embed=worker_gateway_pb2.EmbedPayload(inputs=list(inputs)),
    )


def test_frames_round_trip_through_a_blocking_stream() -> None:
    stream = io.BytesIO()
    first, second = _embed_request(1, "hello"), _embed_request(2, "a", "b")
    write_frame(stream, first)
    write_frame(stream, model_host_pb2.HostRequest(shutdown=model_host_pb2.Shutdown()))
    write_frame(stream, second)
    stream.seek(0)
    assert model_host_pb2.HostRequest.FromString(read_frame(stream) or b"") == first
    shutdown = model_host_pb2.HostRequest.FromString(read_frame(stream) or b"")
    assert shutdown.WhichOneof("kind") == "shutdown"
    assert model_host_pb2.HostRequest.FromString(read_frame(stream) or b"") == second
    assert read_frame(stream) is None


async def test_frames_round_trip_through_an_asyncio_stream() -> None:
    reader = asyncio.StreamReader()
    first, second = _embed_request(7, "x"), _embed_request(8, "y", "z")
    reader.feed_data(encode_frame(first) + encode_frame(second))
    reader.feed_eof()
    assert model_host_pb2.HostRequest.FromString(await read_frame_async(reader) or b"") == first
    assert model_host_pb2.HostRequest.FromString(await read_frame_async(reader) or b"") == second
    assert await read_frame_async(reader) is None


async def test_frames_sent_in_one_turn_of_the_loop_go_in_one_write_in_their_order() -> None:
    """The worker's side of the pipe: invocations one stream message brings leave together."""
    near, far = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=near)
    far_reader, far_writer = await asyncio.open_connection(sock=far)
    writes: list[bytes] = []
    write = writer.write
    writer.write = lambda data: (writes.append(bytes(data)), write(data))[1]  # type: ignore[method-assign]
    try:
        sender = FrameSender(writer)
        sent = [_embed_request(request_id, f"text {request_id}") for request_id in (3, 1, 2)]
        await asyncio.gather(*(sender.send(message) for message in sent))
        with pytest.raises(FrameError):  # one too large fails its own caller, nothing else
            await FrameSender(writer, max_bytes=10).send(_embed_request(4, "far too long"))
        # Reading waits for the turn to end, when the queued frames are written.
        received = [
            model_host_pb2.HostRequest.FromString(await read_frame_async(far_reader) or b"")
            for _ in sent
        ]
        assert received == sent
        assert len(writes) == 1
        await sender.send(_embed_request(5, "later"))
        sender.flush()  # as before the pipe closes: nothing queued is lost
        assert len(writes) == 2
        later = await read_frame_async(far_reader)
        assert model_host_pb2.HostRequest.FromString(later or b"").request_id == 5
    finally:
        writer.close()
        far_writer.close()
        del reader


def test_oversized_frame_is_refused_on_write() -> None:
    with pytest.raises(FrameError):
        encode_frame(_embed_request(1, "x" * 200), max_bytes=100)


def test_oversized_length_prefix_is_refused_before_reading_the_payload() -> None:
    stream = io.BytesIO(struct.pack(">I", 1 << 31) + b"ignored")
    with pytest.raises(FrameError, match="exceeds"):
        read_frame(stream)


async def test_oversized_length_prefix_is_refused_by_the_async_reader() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(struct.pack(">I", 1000))
    reader.feed_eof()
    with pytest.raises(FrameError, match="exceeds"):
        await read_frame_async(reader, max_bytes=999)


def test_truncated_frame_is_an_error_not_an_eof() -> None:
    frame = encode_frame(_embed_request(1, "hello"))
    with pytest.raises(FrameError):
        read_frame(io.BytesIO(frame[:-1]))
    with pytest.raises(FrameError):
        read_frame(io.BytesIO(frame[:2]))


async def test_truncated_frame_is_an_error_for_the_async_reader() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(encode_frame(_embed_request(1, "hello"))[:-1])
    reader.feed_eof()
    with pytest.raises(FrameError):
        await read_frame_async(reader)

"""Length-prefixed protobuf frames on the worker <-> model host pipe: sync and asyncio helpers."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from typing import BinaryIO

from google.protobuf.message import Message

# 4-byte big-endian unsigned length, then that many bytes of one serialized message.
_HEADER = struct.Struct(">I")
HEADER_BYTES = _HEADER.size

# Far above any legitimate embed batch, far below what could exhaust either process's memory: a
# corrupt or hostile length prefix must not make the reader allocate gigabytes.
MAX_FRAME_BYTES = 64 * 1024 * 1024


class FrameError(ValueError):
    """The pipe carried something that is not a valid frame; the channel cannot be trusted after."""


def encode_frame(message: Message, *, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    payload = message.SerializeToString()
    if len(payload) > max_bytes:
        raise FrameError(f"frame of {len(payload)} bytes exceeds the limit of {max_bytes}")
    return _HEADER.pack(len(payload)) + payload


def _payload_length(header: bytes, max_bytes: int) -> int:
    (length,) = _HEADER.unpack(header)
    if length > max_bytes:
        raise FrameError(f"incoming frame of {length} bytes exceeds the limit of {max_bytes}")
    return length


def read_frame(stream: BinaryIO, *, max_bytes: int = MAX_FRAME_BYTES) -> bytes | None:
    """Blocking read of one frame's payload; None on a clean EOF between frames."""
    header = stream.read(HEADER_BYTES)
    if not header:
        return None
    if len(header) < HEADER_BYTES:
        raise FrameError("channel closed inside a frame header")
    length = _payload_length(header, max_bytes)
    payload = stream.read(length) if length else b""
    if len(payload) < length:
        raise FrameError(f"channel closed after {len(payload)} of {length} payload bytes")
    return payload


def write_frame(stream: BinaryIO, message: Message, *, max_bytes: int = MAX_FRAME_BYTES) -> None:
    """Blocking write of one whole frame (flushed, so the peer sees it now)."""
    write_frames(stream, [message], max_bytes=max_bytes)


def write_frames(
    stream: BinaryIO, messages: Sequence[Message], *, max_bytes: int = MAX_FRAME_BYTES
) -> None:
    """Blocking write of whole frames in order, in one write (flushed, so the peer sees them now):
    a batch's answers cost the pipe one system call, not one each."""
    stream.write(b"".join(encode_frame(message, max_bytes=max_bytes) for message in messages))
    stream.flush()


async def read_frame_async(
    reader: asyncio.StreamReader, *, max_bytes: int = MAX_FRAME_BYTES
) -> bytes | None:
    """Read one frame's payload; None on a clean EOF between frames."""
    try:
        header = await reader.readexactly(HEADER_BYTES)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError("channel closed inside a frame header") from exc
    length = _payload_length(header, max_bytes)
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(
            f"channel closed after {len(exc.partial)} of {length} payload bytes"
        ) from exc


class FrameSender:
    """Frames to a pipe's asyncio writer, in order, written together once per turn of the event
    loop: the invocations one worker-stream message brings are sent in one system call.

    Why: with 32 concurrent clients the worker wrote each Invoke's frame with its own `send`, 18 %
    of its event loop (py-spy, issue 29), and the host's reader woke for each. `send` encodes at
    once, so a frame too large fails its caller alone, before anything is written."""

    def __init__(self, writer: asyncio.StreamWriter, *, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self._writer = writer
        self._max_bytes = max_bytes
        self._frames: list[bytes] = []

    async def send(self, message: Message) -> None:
        """Queue one frame for this turn's write; wait while the pipe's buffer is full."""
        self._frames.append(encode_frame(message, max_bytes=self._max_bytes))
        if len(self._frames) == 1:
            asyncio.get_running_loop().call_soon(self.flush)
        await self._writer.drain()

    def flush(self) -> None:
        """Write what is queued now (before the writer closes, too)."""
        if self._frames:
            frames, self._frames = self._frames, []
            self._writer.write(b"".join(frames))

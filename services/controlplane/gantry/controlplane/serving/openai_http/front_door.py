"""What every HTTP call goes through before and around the Inference handlers: the API key (the
gRPC interceptor's own check), the bounds on calls in flight and on the body, the stand-in for
the gRPC call context the handlers read, and cancellation when the client goes away."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

import grpc
from starlette.requests import Request
from starlette.types import Receive

from gantry.common.auth import Authenticator, Principal, Role, authenticate_bearer
from gantry.common.errors import GantryError

_Answer = TypeVar("_Answer")
# A stream's chunks waiting for its client: past it the handler's write waits, and the wait is
# the gRPC door's (worker_sessions bounds what queues behind it: CLIENT_TOO_SLOW).
STREAM_WRITE_BACKLOG = 16
# A call whose body reached this size gives the memory it took back when it ends (give_back).
GIVE_BACK_BYTES = 4 * 1024 * 1024


class BodyTooLarge(Exception):
    def __init__(self, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(f"{size_bytes} > {limit_bytes}")
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class ClientGone(Exception):
    """The HTTP client closed its connection before the answer: nobody to answer."""


class HttpCallContext:
    """What the Inference handlers ask of a `grpc.aio.ServicerContext`, for a call that came over
    HTTP: the time left (none: HTTP carries no deadline, so the server's cap binds, as for a gRPC
    call without one) and, for a stream, `write`, which hands each chunk to the HTTP response in
    order through a bounded queue."""

    def __init__(self) -> None:
        self.chunks: asyncio.Queue[Any] = asyncio.Queue(maxsize=STREAM_WRITE_BACKLOG)

    def time_remaining(self) -> float | None:
        return None

    async def write(self, message: Any) -> None:
        await self.chunks.put(message)

    def as_grpc(self) -> grpc.aio.ServicerContext:
        # Duck-typed: the handlers call only the two methods above.
        return cast(grpc.aio.ServicerContext, self)


class InFlight:
    """Calls running through this door, counted per tenant after authentication: past its bound a
    tenant's call is refused at once (QUEUE_FULL, as the gRPC interceptor refuses one), never
    queued, and one tenant's calls (slow bodies included) never use up another's."""

    def __init__(self, limit_per_tenant: int) -> None:
        self.limit = limit_per_tenant
        self._counts: dict[str, int] = {}

    def count(self, tenant: str) -> int:
        return self._counts.get(tenant, 0)

    def enter(self, tenant: str) -> None:
        held = self._counts.get(tenant, 0)
        if held >= self.limit:
            raise GantryError(
                "QUEUE_FULL",
                f"tenant {tenant!r} has {self.limit} calls in flight on the HTTP API; try again",
                limit=str(self.limit),
                tenant_id=tenant,
            )
        self._counts[tenant] = held + 1

    def leave(self, tenant: str) -> None:
        held = self._counts.get(tenant, 0) - 1
        if held > 0:
            self._counts[tenant] = held
        else:
            self._counts.pop(tenant, None)


async def authenticate(authenticator: Authenticator, headers: Mapping[str, str]) -> Principal:
    """The `Authorization: Bearer <key>` header checked exactly as the gRPC door checks it."""
    return await authenticate_bearer(authenticator, Role.CLIENT, list(headers.items()))


async def read_body(request: Request, limit_bytes: int, timeout_s: float) -> bytes:
    """The whole body, refused (BodyTooLarge) as soon as it is known to pass the bound: by its
    Content-Length before a byte is read, else while it streams in; and refused CLIENT_TOO_SLOW
    when it has not all arrived within `timeout_s`, so a trickled body cannot hold its caller's
    in-flight slot and connection for ever."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit_bytes:
        raise BodyTooLarge(int(declared), limit_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit_bytes:
                    raise BodyTooLarge(size, limit_bytes)
                chunks.append(chunk)
    except TimeoutError:
        raise GantryError(
            "CLIENT_TOO_SLOW",
            f"the request body did not arrive within {timeout_s:g}s ({size} bytes came)",
            timeout_s=f"{timeout_s:g}",
        ) from None
    return b"".join(chunks)


def _libc_malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
        return trim
    except (OSError, AttributeError):
        return None  # not glibc (musl, macOS): its allocator returns large blocks by itself


_MALLOC_TRIM = _libc_malloc_trim()


def give_back() -> None:
    """The memory of a large body returned to the system, once its call was answered.

    A refused call's body is held by a reference cycle (an exception's traceback, the frame that
    raised it, the body in that frame) until the collector's next full pass, and glibc keeps what
    was freed in its arenas: 16 calls of 30 MB left the control plane at 1 GB long after they
    were answered. So: one collection, then `malloc_trim(0)`. Both cost milliseconds, paid only
    after a body of GIVE_BACK_BYTES or more, which took far longer to arrive.
    """
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


async def until_disconnected(receive: Receive) -> None:
    """Returns when the client has closed its connection (the body was read before)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive: Receive, call: Awaitable[_Answer]) -> _Answer:
    """`call`'s answer; a client that goes away first cancels it (ClientGone), as a gRPC client
    that goes away cancels its handler: the worker drops the invocation, the scheduler hears
    one WorkFinished, CANCELLED."""
    task = asyncio.ensure_future(call)
    watcher = asyncio.ensure_future(until_disconnected(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientGone()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

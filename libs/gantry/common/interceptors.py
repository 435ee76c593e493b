"""The one server interceptor: authenticate by role, then map every failure to a gRPC status once.

Handlers raise GantryError and never call `context.abort`; anything unexpected becomes INTERNAL
with a generic message (logged here with its traceback, never sent to the client).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from gantry.common.auth import (
    Authenticator,
    Principal,
    authenticate_bearer,
    required_role,
    set_principal,
)
from gantry.common.errors import GantryError
from gantry.common.status import to_rich_status

log = logging.getLogger(__name__)


async def _abort(context: grpc.aio.ServicerContext, error: GantryError) -> None:
    status = to_rich_status(error)
    await context.abort(status.code, status.details, trailing_metadata=status.trailing_metadata)


def _unexpected(method: str, exc: BaseException) -> GantryError:
    log.exception("unexpected failure in %s", method, exc_info=exc)
    return GantryError("INTERNAL", f"internal error in {method} ({type(exc).__name__})")


@dataclass(frozen=True, slots=True)
class ServiceLimit:
    """Per-service bounds, checked before a handler runs: request size and calls in flight."""

    max_request_bytes: int | None  # None: only the server-wide receive limit applies
    max_in_flight: int


# Sized to the largest legal request of each service. The server-wide receive limit stays high
# for the worker stream's results; a unary request over its own service's bound is refused
# before it is parsed.
DEFAULT_LIMITS: Mapping[str, ServiceLimit] = {
    "/gantry.v1.Inference/": ServiceLimit(max_request_bytes=8 * 1024 * 1024, max_in_flight=1024),
    "/gantry.v1.ControlPlane/": ServiceLimit(max_request_bytes=32 * 1024 * 1024, max_in_flight=64),
    "/gantry.v1.WorkerGateway/": ServiceLimit(max_request_bytes=None, max_in_flight=10_000),
    "/gantry.v1.Scheduler/": ServiceLimit(max_request_bytes=None, max_in_flight=64),
}


@dataclass(frozen=True, slots=True)
class _Unparsed:
    """What a guarded deserializer returns instead of a request it will not or cannot parse: the
    handler wrapper raises the refusal, so the client gets a typed status, not gRPC's UNKNOWN."""

    refusal: GantryError


def _guarded(
    deserializer: Callable[[bytes], Any] | None, limit: int | None, method: str
) -> Callable[[bytes], Any] | None:
    """Refuse a single request over the service's byte limit before parsing it, and one whose
    bytes are not a valid message (corrupt wire data, invalid UTF-8 in a string field)."""
    if deserializer is None and limit is None:
        return None

    def deserialize(raw: bytes) -> Any:
        if limit is not None and len(raw) > limit:
            return _Unparsed(
                GantryError(
                    "INVALID_ARGUMENT",
                    f"the request is {len(raw)} bytes; this service takes at most {limit}",
                    size_bytes=str(len(raw)),
                    limit_bytes=str(limit),
                )
            )
        if deserializer is None:
            return raw
        try:
            return deserializer(raw)
        except DecodeError as exc:
            return _Unparsed(
                GantryError("INVALID_ARGUMENT", f"the request to {method} does not parse: {exc}")
            )

    return deserialize


class _InFlight:
    """Calls running per service; over the bound a call is refused at once, never queued."""

    def __init__(self, limits: Mapping[str, ServiceLimit]) -> None:
        self._limits = limits
        self._counts: dict[str, int] = {}

    def limit_of(self, method: str) -> tuple[str, ServiceLimit] | None:
        for prefix, limit in self._limits.items():
            if method.startswith(prefix):
                return prefix, limit
        return None

    def enter(self, method: str) -> str | None:
        found = self.limit_of(method)
        if found is None:
            return None
        prefix, limit = found
        if self._counts.get(prefix, 0) >= limit.max_in_flight:
            raise GantryError(
                "QUEUE_FULL",
                f"{prefix.strip('/')} has {limit.max_in_flight} calls in flight; try again",
                limit=str(limit.max_in_flight),
            )
        self._counts[prefix] = self._counts.get(prefix, 0) + 1
        return prefix

    def leave(self, prefix: str | None) -> None:
        if prefix is not None:
            self._counts[prefix] -= 1


class GantryServerInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates before the request body is parsed and wraps every handler shape.

    A call that fails authentication gets a handler without a request deserializer: its bytes are
    never parsed. Every shape (unary/stream in, unary/stream out) is wrapped; none is passed
    through unauthenticated.
    """

    def __init__(
        self,
        authenticator: Authenticator | None,
        *,
        limits: Mapping[str, ServiceLimit] = DEFAULT_LIMITS,
    ) -> None:
        self._authenticator = authenticator
        self._in_flight = _InFlight(limits)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        metadata = handler_call_details.invocation_metadata  # type: ignore[attr-defined]
        try:
            principal = await self._authenticate(method, metadata)
        except GantryError as error:
            return _refusal(handler, error)
        except Exception as exc:
            return _refusal(handler, _unexpected(method, exc))
        return self._wrap(handler, method, principal)

    async def _authenticate(self, method: str, metadata: Any) -> Principal | None:
        if self._authenticator is None:  # a bare server (tests of the interceptor itself)
            return None
        role = required_role(method)
        if role is None:
            return None
        return await authenticate_bearer(self._authenticator, role, metadata)

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str, principal: Any) -> Any:
        found = self._in_flight.limit_of(method)
        request_limit = found[1].max_request_bytes if found else None
        # A single request is bounded and parsed before the handler. A stream's messages are
        # parsed as they come (bounded by the handler: the worker stream's wire_bounds): one that
        # does not parse ends the stream with its typed refusal (`_parsed_stream`).
        if handler.unary_unary is not None or handler.unary_stream is not None:
            deserializer = _guarded(handler.request_deserializer, request_limit, method)
        else:
            deserializer = _guarded(handler.request_deserializer, None, method)
        serving = functools.partial(self._serving, method, principal)
        if handler.unary_unary is not None or handler.stream_unary is not None:
            return _unary_response(handler, serving, deserializer)
        if handler.stream_stream is not None or handler.unary_stream is not None:
            return _stream_response(handler, serving, deserializer)
        # A shape this interceptor does not know is refused, never served unauthenticated.
        return _refusal(handler, GantryError("INTERNAL", f"{method} has an unknown handler shape"))

    @contextlib.asynccontextmanager
    async def _serving(
        self, method: str, principal: Any, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[None]:
        """One call of any shape: admitted (parsed, within its service's calls in flight), then
        every failure mapped to a status once; cancellation and an abort pass through as they are.
        """
        set_principal(principal)
        slot: str | None = None
        try:
            if isinstance(request, _Unparsed):
                raise request.refusal
            slot = self._in_flight.enter(method)
            yield
        except GantryError as error:
            await _abort(context, error)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            await _abort(context, _unexpected(method, exc))
        finally:
            self._in_flight.leave(slot)


# How a wrapped handler serves one call: GantryServerInterceptor._serving, bound to its method.
_Serving = Callable[[Any, grpc.aio.ServicerContext], contextlib.AbstractAsyncContextManager[None]]


def _unary_response(
    handler: grpc.RpcMethodHandler, serving: _Serving, deserializer: Callable[[bytes], Any] | None
) -> Any:
    """A unary-unary or stream-unary handler that runs the original inside `serving`."""
    inner = handler.unary_unary or handler.stream_unary

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with serving(request, context):
            if handler.stream_unary is not None:
                request = _parsed_stream(request)
            return await inner(request, context)

    factory = (
        grpc.unary_unary_rpc_method_handler
        if handler.unary_unary is not None
        else grpc.stream_unary_rpc_method_handler
    )
    return factory(
        unary, request_deserializer=deserializer, response_serializer=handler.response_serializer
    )


def _stream_response(
    handler: grpc.RpcMethodHandler, serving: _Serving, deserializer: Callable[[bytes], Any] | None
) -> Any:
    """A stream-stream or unary-stream handler that runs the original inside `serving`; the
    original may be an async generator or a coroutine that writes to its context."""
    inner = handler.stream_stream or handler.unary_stream

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async with serving(request, context):
            if handler.stream_stream is not None:
                request = _parsed_stream(request)
            result = inner(request, context)
            if inspect.isasyncgen(result):
                async for response in result:
                    yield response
            else:
                await result

    factory = (
        grpc.stream_stream_rpc_method_handler
        if handler.stream_stream is not None
        else grpc.unary_stream_rpc_method_handler
    )
    return factory(
        stream, request_deserializer=deserializer, response_serializer=handler.response_serializer
    )


async def _parsed_stream(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A request stream whose first message that did not parse is raised as its refusal
    (INVALID_ARGUMENT): the handler ends the stream with it, as it ends on any GantryError."""
    async for request in requests:
        if isinstance(request, _Unparsed):
            raise request.refusal
        yield request


def _refusal(handler: grpc.RpcMethodHandler, error: GantryError) -> Any:
    """A handler of the same shape that aborts at once, leaving the request bytes unparsed."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _abort(context, error)

    async def refuse_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await _abort(context, error)
        yield  # pragma: no cover - abort raises first

    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(refuse)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse_stream)
    return grpc.stream_stream_rpc_method_handler(refuse_stream)

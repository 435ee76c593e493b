"""The one server interceptor: authenticate by role, then map every failure to a gRPC status once.

Handlers raise GantryError and never call `context.abort`; anything unexpected becomes INTERNAL
with a generic message (logged here with its traceback, never sent to the client).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from gantry.common.auth import (
    Authenticator,
    Principal,
    bearer_token,
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


class GantryServerInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates before the request body is parsed and wraps every handler shape.

    A call that fails authentication gets a handler without a request deserializer: its bytes are
    never parsed. Every shape (unary/stream in, unary/stream out) is wrapped; none is passed
    through unauthenticated.
    """

    def __init__(self, authenticator: Authenticator | None) -> None:
        self._authenticator = authenticator

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
        return await self._authenticator.authenticate(role, bearer_token(metadata))

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str, principal: Any) -> Any:
        if handler.unary_unary is not None or handler.stream_unary is not None:
            inner_unary = handler.unary_unary or handler.stream_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                set_principal(principal)
                try:
                    return await inner_unary(request, context)
                except GantryError as error:
                    await _abort(context, error)
                except (asyncio.CancelledError, grpc.aio.AbortError):
                    raise
                except Exception as exc:
                    await _abort(context, _unexpected(method, exc))

            unary_factory = (
                grpc.unary_unary_rpc_method_handler
                if handler.unary_unary is not None
                else grpc.stream_unary_rpc_method_handler
            )
            return unary_factory(
                unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None or handler.unary_stream is not None:
            streaming = handler.stream_stream is not None
            inner_stream = handler.stream_stream or handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                set_principal(principal)
                try:
                    result = inner_stream(request, context)
                    if inspect.isasyncgen(result):
                        async for response in result:
                            yield response
                    else:
                        await result
                except GantryError as error:
                    await _abort(context, error)
                except (asyncio.CancelledError, grpc.aio.AbortError):
                    raise
                except Exception as exc:
                    await _abort(context, _unexpected(method, exc))

            factory = (
                grpc.stream_stream_rpc_method_handler
                if streaming
                else grpc.unary_stream_rpc_method_handler
            )
            return factory(
                stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        # A shape this interceptor does not know is refused, never served unauthenticated.
        return _refusal(handler, GantryError("INTERNAL", f"{method} has an unknown handler shape"))


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

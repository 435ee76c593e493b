"""The OpenAI-compatible routes: each turns its JSON body into the gRPC request message and calls
the Inference servicer's own method (InferenceService.Embed, Generate, GenerateStream) with it.

So below the protocol there is one path: the key is checked by the gRPC interceptor's function and
the call runs as that principal; validation, the capability binding, the scheduler's admission and
fair queue, the worker, and gantry_invocations are the handlers' own. This module adds only what
HTTP needs around them: the bounds on the body and on calls in flight, the W3C `traceparent`
header as the parent span, the OpenAI error shape, and gantry_front_door_calls by protocol.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from opentelemetry import trace
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gantry.common.auth import Authenticator, set_principal
from gantry.common.errors import GantryError
from gantry.common.telemetry import extract_context, tracer
from gantry.controlplane.platform import metrics
from gantry.controlplane.platform.database import Database
from gantry.controlplane.serving.kserve.service import KServeInference
from gantry.controlplane.serving.openai_http import catalog
from gantry.controlplane.serving.openai_http.connections import AUTHENTICATED
from gantry.controlplane.serving.openai_http.errors import (
    BODY_TOO_LARGE_STATUS,
    body_too_large_error,
    http_error,
)
from gantry.controlplane.serving.openai_http.front_door import (
    GIVE_BACK_BYTES,
    BodyTooLarge,
    ClientGone,
    HttpCallContext,
    InFlight,
    authenticate,
    give_back,
    read_body,
    unless_disconnected,
)
from gantry.controlplane.serving.openai_http.kserve_routes import KServeRest
from gantry.controlplane.serving.openai_http.kserve_routes import refusal as kserve_refusal
from gantry.controlplane.serving.openai_http.requests import (
    GenerationCall,
    chat_completion_call,
    completion_call,
    embedding_call,
    json_object,
)
from gantry.controlplane.serving.openai_http.responses import (
    Completion,
    completion_body,
    embeddings_body,
    model_body,
    models_body,
)
from gantry.controlplane.serving.openai_http.streaming import cancel, next_chunk, stream_events_of
from gantry.v1 import inference_pb2_grpc

log = logging.getLogger(__name__)
_tracer = tracer("gantry.controlplane")
CLIENT_GONE_STATUS = 499  # nobody reads it; the access log and the span say what happened
_Operation = Callable[[Request], Awaitable[Response]]


@dataclass
class _Call:
    """One HTTP call's span, in-flight slot and count; `finish` ends them once, when the answer
    is complete (for a stream, when its last event is written or its client has gone)."""

    method: str
    span: trace.Span
    protocol: str = metrics.PROTOCOL_OPENAI
    in_flight: InFlight | None = None
    tenant: str = ""
    started: float = field(default_factory=time.perf_counter)
    done: bool = False
    body_bytes: int = 0  # what its body took, given back when it ends if large

    def finish(self, error: BaseException | None) -> None:
        if self.done:
            return
        self.done = True
        if self.in_flight is not None:
            self.in_flight.leave(self.tenant)
        metrics.front_door_answered(self.protocol, self.method, error)
        if isinstance(error, GantryError):
            self.span.set_attribute("gantry.reason", error.reason)
            self.span.set_status(trace.StatusCode.ERROR, error.reason)
        elif error is not None:
            self.span.set_status(trace.StatusCode.ERROR, type(error).__name__)
        self.span.end()


class OpenAiRoutes:
    def __init__(
        self,
        *,
        inference: inference_pb2_grpc.InferenceServicer,
        authenticator: Authenticator,
        database: Database,
        max_body_bytes: int,
        max_in_flight: int,
        body_timeout_s: float,
        kserve: KServeInference | None = None,
    ) -> None:
        self._inference = inference
        self._kserve = kserve  # the Open Inference Protocol's REST routes (kserve_routes.py)
        self._authenticator = authenticator
        self._database = database
        self._max_body_bytes = max_body_bytes
        self.in_flight = InFlight(max_in_flight)
        self._body_timeout_s = body_timeout_s

    def app(self) -> Starlette:
        def route(path: str, operation: _Operation, method: str, door: _Door = OPENAI) -> Route:
            async def endpoint(request: Request) -> Response:
                return await self._answer(request, path, operation, door)

            return Route(path, endpoint, methods=[method])

        kserve_routes = (
            []
            if self._kserve is None
            else [
                route(r.path, r.operation, r.method, KSERVE_OPEN if r.open else KSERVE)
                for r in KServeRest(self._kserve, self._body).routes()
            ]
        )
        return Starlette(
            routes=[
                route("/v1/embeddings", self._embeddings, "POST"),
                route("/v1/completions", self._completions, "POST"),
                route("/v1/chat/completions", self._chat_completions, "POST"),
                route("/v1/models", self._models, "GET"),
                route("/v1/models/{model:path}", self._model, "GET"),
                *kserve_routes,
            ],
            exception_handlers={HTTPException: _http_exception},
        )

    async def _answer(
        self, request: Request, path: str, operation: _Operation, door: _Door
    ) -> Response:
        """One call answered; a large body's memory given back once nothing holds it (the
        failure that refused it included: its traceback holds the body until it is gone)."""
        response = await self._answer_call(request, path, operation, door)
        call: _Call | None = getattr(request.state, "call", None)
        if call is not None and call.body_bytes >= GIVE_BACK_BYTES:
            give_back()
        return response

    async def _answer_call(
        self, request: Request, path: str, operation: _Operation, door: _Door
    ) -> Response:
        """Authenticate, bound, trace and count one call; every failure in its door's shape."""
        span = _tracer.start_span(
            f"{request.method} {path}",
            context=extract_context(request.headers),
            kind=trace.SpanKind.SERVER,
            attributes={"gantry.protocol": door.protocol, "http.route": path},
        )
        call = _Call(method=path, span=span, protocol=door.protocol)
        response: Response
        try:
            with trace.use_span(span, end_on_exit=False):
                if door.open:  # a probe: no key, no tenant, nothing read
                    request.state.call = call
                    response = await operation(request)
                    call.finish(None)
                    return response
                principal = await authenticate(self._authenticator, request.headers)
                request.scope[AUTHENTICATED] = True  # a refusal may linger for its body
                set_principal(principal)  # this request's task only, as the interceptor does
                span.set_attribute("gantry.tenant_id", principal.subject)
                self.in_flight.enter(principal.subject)
                call.in_flight, call.tenant = self.in_flight, principal.subject
                request.state.call = call
                response = await operation(request)
        except GantryError as error:
            call.finish(error)
            return door.refuse(error, None)
        except BodyTooLarge as too_large:
            call.finish(GantryError("INVALID_ARGUMENT", "request body too large"))
            refused = body_too_large_error(too_large.size_bytes, too_large.limit_bytes)
            return door.refuse(refused, BODY_TOO_LARGE_STATUS)
        except (ClientGone, ClientDisconnect):
            call.finish(asyncio.CancelledError())
            return Response(status_code=CLIENT_GONE_STATUS)
        except Exception as exc:
            log.exception("unexpected failure in %s %s", request.method, path, exc_info=exc)
            internal = GantryError("INTERNAL", f"internal error in {path} ({type(exc).__name__})")
            call.finish(internal)
            return door.refuse(internal, None)
        except BaseException as failure:
            call.finish(failure)
            raise
        if not isinstance(response, StreamingResponse):
            call.finish(None)  # a stream finishes its call when it ends
        return response

    async def _body(self, request: Request) -> bytes:
        body = await read_body(request, self._max_body_bytes, self._body_timeout_s)
        call: _Call = request.state.call
        call.body_bytes = len(body)
        return body

    async def _embeddings(self, request: Request) -> Response:
        embedding = embedding_call(json_object(await self._body(request)))
        answer = await unless_disconnected(
            request.receive,
            self._inference.Embed(embedding.request, HttpCallContext().as_grpc()),
        )
        body = embeddings_body(
            answer, model=embedding.request.capability, encoding_format=embedding.encoding_format
        )
        return JSONResponse(body, headers=_served_headers(answer.deployment_id, answer.node_id))

    async def _completions(self, request: Request) -> Response:
        body = json_object(await self._body(request))
        return await self._generate(request, completion_call(body), chat=False)

    async def _chat_completions(self, request: Request) -> Response:
        body = json_object(await self._body(request))
        return await self._generate(request, chat_completion_call(body), chat=True)

    async def _generate(
        self, request: Request, generation: GenerationCall, *, chat: bool
    ) -> Response:
        completion = Completion(
            completion_id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=generation.request.capability,
            chat=chat,
        )
        if not generation.stream:
            answer = await unless_disconnected(
                request.receive,
                self._inference.Generate(generation.request, HttpCallContext().as_grpc()),
            )
            return JSONResponse(
                completion_body(completion, answer),
                headers=_served_headers(answer.deployment_id, answer.node_id),
            )
        context = HttpCallContext()
        task = asyncio.ensure_future(
            self._inference.GenerateStream(generation.request, context.as_grpc())  # type: ignore[func-returns-value]
        )
        try:
            # Until the first chunk a failure (unknown model, queue full) is an HTTP status.
            first = await unless_disconnected(request.receive, next_chunk(context, task))
        except BaseException:
            await cancel(task)
            raise
        if first is None:
            raise GantryError("INTERNAL", "the stream ended before its last chunk")
        call: _Call = request.state.call

        async def closed() -> None:
            # A client gone before the first event was written never starts the events at all:
            # the handler is cancelled and the call finished here, whatever happened.
            await cancel(task)
            call.finish(asyncio.CancelledError())

        return _EventStream(
            stream_events_of(
                completion=completion,
                first=first,
                context=context,
                task=task,
                include_usage=generation.include_usage,
                finished=call.finish,
            ),
            closed=closed,
        )

    async def _models(self, request: Request) -> Response:
        async with self._database.read() as session:
            entries = await catalog.list_models(session)
        return JSONResponse(models_body(entries))

    async def _model(self, request: Request) -> Response:
        async with self._database.read() as session:
            entry = await catalog.get_model(session, request.path_params["model"])
        return JSONResponse(model_body(entry))


class _EventStream(StreamingResponse):
    """Server-sent events that run `closed` once the response is over, however it ended."""

    def __init__(self, events: AsyncIterator[bytes], *, closed: Callable[[], Awaitable[None]]):
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )
        self._closed = closed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._closed()


def _served_headers(deployment_id: str, node_id: str) -> dict[str, str]:
    """Where the call ran, as the gRPC responses say it (deployment_id, node_id)."""
    return {"x-gantry-deployment-id": deployment_id, "x-gantry-node-id": node_id}


def _openai_refusal(error: GantryError, status: int | None) -> Response:
    refused = http_error(error, status=status)
    return JSONResponse(refused.body, status_code=refused.status)


@dataclass(frozen=True, slots=True)
class _Door:
    """Which protocol a route speaks: what it is counted and traced as, how it refuses a call,
    and whether it is open (a probe, answered without a key)."""

    protocol: str
    refuse: Callable[[GantryError, int | None], Response]
    open: bool = False


OPENAI = _Door(metrics.PROTOCOL_OPENAI, _openai_refusal)
KSERVE = _Door(metrics.PROTOCOL_KSERVE, kserve_refusal)
KSERVE_OPEN = _Door(metrics.PROTOCOL_KSERVE, kserve_refusal, open=True)


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route, wrong method) in the shape of the protocol
    whose paths were asked for (/v2: the Open Inference Protocol's, else the OpenAI one)."""
    status, detail = (exc.status_code, exc.detail) if isinstance(exc, HTTPException) else (500, "")
    reason = "NOT_FOUND" if status == 404 else "INVALID_ARGUMENT"
    door = KSERVE if request.url.path.startswith("/v2") else OPENAI
    message = f"{request.method} {request.url.path}: {detail or 'not served'}"
    return door.refuse(GantryError(reason, message), status)

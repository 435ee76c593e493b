"""The serving calls of the worker's seam to a model host: one typed request, its checked answer.

`ModelHost` owns the child and its pipe; this mixin holds what it asks the child: one `invoke` for
every inference operation's kind (gantry.common.operations), its request and answer checked by
the kind's entries in `host_answers` before the worker trusts it. Each raises
GantryError: the child's own refusal (INVALID_PAYLOAD naming the field, INPUT_TOO_LONG, ...),
INVOKE_FAILED for an answer that disagrees with the request, and what `ModelHost._call` raises
(RUNTIME_CRASHED, RUNTIME_UNRESPONSIVE, DEADLINE_EXCEEDED, QUEUE_FULL, DEPLOYMENT_NOT_READY).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NotRequired, Protocol, TypedDict, Unpack, cast

from google.protobuf.message import Message

from gantry.common import operations
from gantry.common.errors import GantryError
from gantry.v1 import model_host_pb2, worker_gateway_pb2
from gantry.worker.model_host.host_answers import (
    REQUEST_CHECKS,
    Asked,
    StreamedDeltas,
    checked_answer,
)

# Frames a request gets before its answer (a generation's deltas), in the order they came.
OnProgress = Callable[[model_host_pb2.HostResponse], None]


class SendRequest(Protocol):
    """`ModelHost._call`: one request to the child and its answer, within `timeout_s`."""

    async def __call__(
        self,
        request: model_host_pb2.HostRequest,
        *,
        timeout_s: float,
        queue_timeout: bool = ...,
        on_progress: OnProgress | None = ...,
    ) -> model_host_pb2.HostResponse: ...


class InvokeOptions(TypedDict):
    """What every inference call to a host carries besides its kind and payload, declared once
    for the hosts that answer it (HostCalls, ManagedServer) and the protocol supervision reads."""

    trace_context: Mapping[str, str]
    timeout_s: float
    # Where a streamed generation's deltas go, in order, before the result (None: nowhere).
    on_delta: NotRequired[Callable[[worker_gateway_pb2.GenerateDelta], None] | None]


class HostCalls:
    """The requests a worker sends a running model host (mixed into `ModelHost`)."""

    _call: SendRequest  # ModelHost's own

    @property
    def ready(self) -> model_host_pb2.HostReady:
        raise NotImplementedError

    async def invoke(
        self, kind: str, payload: Message, **options: Unpack[InvokeOptions]
    ) -> Message:
        """Run one `kind` request (an operation's kind, gantry.common.operations) in the child
        and return its checked answer (host_answers). A kind that streams (a generation asked
        to) passes each delta to `on_delta` in order, on the event loop, before this returns
        (the result's text is them joined); cancelling the awaiting task stops it in the child
        between two tokens. Raises GantryError: the child's own refusal (INVALID_PAYLOAD naming
        the field, for a kind its adapter does not serve too; INPUT_TOO_LONG), INVOKE_FAILED for
        an answer that disagrees with the request, RUNTIME_CRASHED (the child died meanwhile),
        RUNTIME_UNRESPONSIVE, DEADLINE_EXCEEDED, QUEUE_FULL, DEPLOYMENT_NOT_READY."""
        if kind not in operations.KINDS:
            raise GantryError("INVALID_PAYLOAD", f"{kind!r} is no inference operation's kind")
        refuse = REQUEST_CHECKS.get(kind)
        if refuse is not None:
            refuse(payload)
        request = model_host_pb2.HostRequest(trace_context=dict(options["trace_context"]))
        getattr(request, kind).CopyFrom(payload)
        deltas = StreamedDeltas(
            stream=bool(getattr(payload, "stream", False)), forward=options.get("on_delta")
        )
        response = await self._call(
            request,
            timeout_s=options["timeout_s"],
            on_progress=deltas.receive if kind in operations.STREAMING_KINDS else None,
        )
        return checked_answer(
            kind, response, Asked(payload=payload, dim=self.ready.dim, deltas=deltas)
        )

    # Typed shorthands for callers that hold one kind's arguments (tests, tools): each is
    # `invoke` with that kind. The worker calls `invoke`; a new operation needs none of these.

    async def embed(
        self,
        inputs: Sequence[str],
        *,
        trace_context: Mapping[str, str],
        timeout_s: float,
        truncate: bool = False,
    ) -> worker_gateway_pb2.EmbedResult:
        """Embed `inputs` (INPUT_TOO_LONG for an input past the model's token limit without
        `truncate`)."""
        payload = worker_gateway_pb2.EmbedPayload(inputs=list(inputs), truncate=truncate)
        return cast(
            worker_gateway_pb2.EmbedResult,
            await self.invoke("embed", payload, trace_context=trace_context, timeout_s=timeout_s),
        )

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        trace_context: Mapping[str, str],
        timeout_s: float,
        truncate: bool = False,
    ) -> worker_gateway_pb2.RerankResult:
        """One score per document against `query`, in their order (a cross-encoder host)."""
        payload = worker_gateway_pb2.RerankPayload(
            query=query, documents=list(documents), truncate=truncate
        )
        return cast(
            worker_gateway_pb2.RerankResult,
            await self.invoke("rerank", payload, trace_context=trace_context, timeout_s=timeout_s),
        )

    async def transcribe(
        self, payload: worker_gateway_pb2.TranscribePayload, **call: Any
    ) -> worker_gateway_pb2.TranscribeResult:
        return cast(
            worker_gateway_pb2.TranscribeResult, await self.invoke("transcribe", payload, **call)
        )

    async def recognize_text(
        self, payload: worker_gateway_pb2.RecognizeTextPayload, **call: Any
    ) -> worker_gateway_pb2.RecognizeTextResult:
        return cast(
            worker_gateway_pb2.RecognizeTextResult,
            await self.invoke("recognize_text", payload, **call),
        )

    async def embed_image(
        self, payload: worker_gateway_pb2.EmbedImagePayload, **call: Any
    ) -> worker_gateway_pb2.EmbedResult:
        return cast(
            worker_gateway_pb2.EmbedResult, await self.invoke("embed_image", payload, **call)
        )

    async def classify_image(
        self, payload: worker_gateway_pb2.ClassifyImagePayload, **call: Any
    ) -> worker_gateway_pb2.ClassifyImageResult:
        return cast(
            worker_gateway_pb2.ClassifyImageResult,
            await self.invoke("classify_image", payload, **call),
        )

    async def generate(
        self, payload: worker_gateway_pb2.GeneratePayload, **call: Any
    ) -> worker_gateway_pb2.GenerateResult:
        return cast(
            worker_gateway_pb2.GenerateResult, await self.invoke("generate", payload, **call)
        )

    async def ping(self, *, timeout_s: float) -> model_host_pb2.Pong:
        """Liveness: the child's reader thread answers even mid forward pass. Raises GantryError
        (DEADLINE_EXCEEDED when it did not answer in time, RUNTIME_CRASHED, ...)."""
        request = model_host_pb2.HostRequest(ping=model_host_pb2.Ping())
        response = await self._call(request, timeout_s=timeout_s, queue_timeout=False)
        if response.WhichOneof("kind") != "pong":
            raise GantryError("INVOKE_FAILED", "model host answered a ping with something else")
        return response.pong

    async def check_model(self, *, timeout_s: float) -> worker_gateway_pb2.HealthReport:
        """One real forward pass on the probe text in the child; the report's model layer."""
        request = model_host_pb2.HostRequest(health=model_host_pb2.HealthCheck())
        response = await self._call(request, timeout_s=timeout_s)
        kind = response.WhichOneof("kind")
        if kind == "failure":
            raise GantryError.from_failure(response.failure)
        if kind != "health":
            raise GantryError("INVOKE_FAILED", f"model host answered a health check with {kind!r}")
        return response.health

    async def probe_check(self, *, timeout_s: float) -> model_host_pb2.ProbeResult:
        """A probe's evidence from the child: one forward pass, its output and the memory."""
        request = model_host_pb2.HostRequest(probe_check=model_host_pb2.ProbeCheck())
        response = await self._call(request, timeout_s=timeout_s)
        kind = response.WhichOneof("kind")
        if kind == "failure":
            raise GantryError.from_failure(response.failure)
        if kind != "probe":
            raise GantryError("HEALTH_FAILED", f"model host answered a probe check with {kind!r}")
        return response.probe

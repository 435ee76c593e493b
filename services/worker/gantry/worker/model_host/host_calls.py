"""The serving calls of the worker's seam to a model host: one typed request, its checked answer.

`ModelHost` owns the child and its pipe; this mixin holds what it asks the child, one method per
request kind, each answer checked by `host_answers` before the worker trusts it. Each raises
GantryError: the child's own refusal (INVALID_PAYLOAD naming the field, INPUT_TOO_LONG, ...),
INVOKE_FAILED for an answer that disagrees with the request, and what `ModelHost._call` raises
(RUNTIME_CRASHED, RUNTIME_UNRESPONSIVE, DEADLINE_EXCEEDED, QUEUE_FULL, DEPLOYMENT_NOT_READY).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from gantry.common.errors import GantryError
from gantry.v1 import model_host_pb2, worker_gateway_pb2
from gantry.worker.model_host.host_answers import (
    StreamedDeltas,
    checked_classify_image,
    checked_embed,
    checked_generate,
    checked_recognize_text,
    checked_rerank,
    checked_transcribe,
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


class HostCalls:
    """The requests a worker sends a running model host (mixed into `ModelHost`)."""

    _call: SendRequest  # ModelHost's own

    @property
    def ready(self) -> model_host_pb2.HostReady:
        raise NotImplementedError

    async def embed(
        self,
        inputs: Sequence[str],
        *,
        trace_context: Mapping[str, str],
        timeout_s: float,
        truncate: bool = False,
    ) -> worker_gateway_pb2.EmbedResult:
        """Embed `inputs` in the child. Raises GantryError: INVALID_PAYLOAD, INPUT_TOO_LONG (an
        input past the model's token limit without `truncate`), INVOKE_FAILED, RUNTIME_CRASHED
        (the child died meanwhile), RUNTIME_UNRESPONSIVE, DEADLINE_EXCEEDED, QUEUE_FULL,
        DEPLOYMENT_NOT_READY."""
        if not inputs:
            raise GantryError("INVALID_PAYLOAD", "an embed request needs at least one input")
        request = model_host_pb2.HostRequest(
            trace_context=dict(trace_context),
            embed=worker_gateway_pb2.EmbedPayload(inputs=list(inputs), truncate=truncate),
        )
        response = await self._call(request, timeout_s=timeout_s)
        return checked_embed(response, input_count=len(inputs), dim=self.ready.dim)

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        trace_context: Mapping[str, str],
        timeout_s: float,
        truncate: bool = False,
    ) -> worker_gateway_pb2.RerankResult:
        """Score each document against `query` in the child (a cross-encoder host); one score
        per document, in their order. Raises GantryError as `embed` does (INVALID_PAYLOAD from
        a host whose adapter does not rerank)."""
        if not query or not documents:
            raise GantryError("INVALID_PAYLOAD", "a rerank request needs a query and documents")
        request = model_host_pb2.HostRequest(
            trace_context=dict(trace_context),
            rerank=worker_gateway_pb2.RerankPayload(
                query=query, documents=list(documents), truncate=truncate
            ),
        )
        response = await self._call(request, timeout_s=timeout_s)
        return checked_rerank(response, document_count=len(documents))

    async def transcribe(
        self,
        payload: worker_gateway_pb2.TranscribePayload,
        *,
        trace_context: Mapping[str, str],
        timeout_s: float,
    ) -> worker_gateway_pb2.TranscribeResult:
        """Transcribe one clip in the child (a Whisper host; decoding happens there). Raises
        GantryError as `embed` does (INVALID_PAYLOAD for audio it cannot take, naming the field)."""
        request = model_host_pb2.HostRequest(trace_context=dict(trace_context))
        request.transcribe.CopyFrom(payload)
        return checked_transcribe(await self._call(request, timeout_s=timeout_s))

    async def recognize_text(
        self,
        payload: worker_gateway_pb2.RecognizeTextPayload,
        *,
        trace_context: Mapping[str, str],
        timeout_s: float,
    ) -> worker_gateway_pb2.RecognizeTextResult:
        """One text per image, in their order (an OCR host; decoding happens there). Raises
        GantryError as `embed` does (INVALID_PAYLOAD naming `images[i]` for an image it cannot
        take, or one past `max_image_pixels`)."""
        request = model_host_pb2.HostRequest(trace_context=dict(trace_context))
        request.recognize_text.CopyFrom(payload)
        response = await self._call(request, timeout_s=timeout_s)
        return checked_recognize_text(response, image_count=len(payload.images))

    async def embed_image(
        self,
        payload: worker_gateway_pb2.EmbedImagePayload,
        *,
        trace_context: Mapping[str, str],
        timeout_s: float,
    ) -> worker_gateway_pb2.EmbedResult:
        """One vector per image, in the space the host's text embeddings share (a SigLIP2 host).
        Raises GantryError as `recognize_text` does."""
        request = model_host_pb2.HostRequest(trace_context=dict(trace_context))
        request.embed_image.CopyFrom(payload)
        response = await self._call(request, timeout_s=timeout_s)
        return checked_embed(response, input_count=len(payload.images), dim=self.ready.dim)

    async def classify_image(
        self,
        payload: worker_gateway_pb2.ClassifyImagePayload,
        *,
        trace_context: Mapping[str, str],
        timeout_s: float,
    ) -> worker_gateway_pb2.ClassifyImageResult:
        """Every image scored against every label, each a probability on its own (a SigLIP2
        host). Raises GantryError as `recognize_text` does, and INVALID_PAYLOAD (`labels`) or
        INPUT_TOO_LONG (`labels[i]`) for labels it cannot score."""
        request = model_host_pb2.HostRequest(trace_context=dict(trace_context))
        request.classify_image.CopyFrom(payload)
        response = await self._call(request, timeout_s=timeout_s)
        return checked_classify_image(
            response, image_count=len(payload.images), label_count=len(payload.labels)
        )

    async def generate(
        self,
        payload: worker_gateway_pb2.GeneratePayload,
        *,
        trace_context: Mapping[str, str],
        timeout_s: float,
        on_delta: Callable[[worker_gateway_pb2.GenerateDelta], None] | None = None,
    ) -> worker_gateway_pb2.GenerateResult:
        """Generate text in the child (a causal LM host). With `payload.stream`, `on_delta` gets
        each delta in order, on the event loop, before this returns the result (whose text is
        them joined). Cancelling the awaiting task stops the generation in the child between two
        tokens. Raises GantryError as `embed` does (INVALID_PAYLOAD naming the field: max_tokens
        past the deployment's limit, messages to a model without a chat template, ...;
        INPUT_TOO_LONG for a prompt that fills the model's context)."""
        request = model_host_pb2.HostRequest(trace_context=dict(trace_context))
        request.generate.CopyFrom(payload)
        deltas = StreamedDeltas(stream=payload.stream, forward=on_delta)
        response = await self._call(request, timeout_s=timeout_s, on_progress=deltas.receive)
        return checked_generate(response, max_tokens=payload.max_tokens, deltas=deltas)

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

"""The model host's serving loop: a reader thread queues frames, the main thread micro-batches."""

from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO, Protocol

import numpy as np
from google.protobuf.message import DecodeError
from opentelemetry import trace

from gantry.common.errors import GantryError
from gantry.common.telemetry import extract_context, flush_tracing, tracer
from gantry.v1 import model_host_pb2, worker_gateway_pb2
from gantry.worker.model_host.framing import FrameError, read_frame, write_frame

logger = logging.getLogger("gantry.model_host")

# How long the first request of a batch waits for company: long enough to catch concurrent callers,
# short enough to be invisible next to a forward pass.
BATCH_WAIT_S = 0.002
DEFAULT_MAX_BATCH_INPUTS = 32

# After the channel closes nobody can receive an answer; if the main thread is stuck in a forward
# pass this long, the reader thread ends the process itself.
CHANNEL_CLOSED_GRACE_S = 5.0
EXIT_CHANNEL_CLOSED = 3

# Test hooks, honoured only when GANTRY_MODEL_HOST_TEST_HOOKS=1: an input equal to one of these
# makes the forward pass hang (so a test can kill the child mid-request) or fail.
TEST_HOOKS_ENV = "GANTRY_MODEL_HOST_TEST_HOOKS"
TEST_HOOK_HANG_INPUT = "__gantry_test_hook__:hang"
TEST_HOOK_FAIL_INPUT = "__gantry_test_hook__:fail"


class Encoder(Protocol):
    """The one call the serving loop makes into the ML runtime (a SentenceTransformer)."""

    def encode(
        self,
        inputs: list[str],
        *,
        batch_size: int,
        convert_to_numpy: bool,
        normalize_embeddings: bool,
        show_progress_bar: bool,
    ) -> np.ndarray: ...


class _ChannelClosed:
    """Queued by the reader thread when the parent's end of the pipe is gone."""


CHANNEL_CLOSED = _ChannelClosed()
InboxItem = model_host_pb2.HostRequest | _ChannelClosed


@dataclass(frozen=True, kw_only=True)
class ServingSettings:
    normalize: bool
    max_batch_inputs: int
    test_hooks: bool

    @classmethod
    def from_adapter(cls, adapter: object) -> ServingSettings:
        max_batch_size = int(getattr(adapter, "max_batch_size", 0))
        return cls(
            normalize=bool(getattr(adapter, "normalize", False)),
            max_batch_inputs=max_batch_size or DEFAULT_MAX_BATCH_INPUTS,
            test_hooks=os.environ.get(TEST_HOOKS_ENV) == "1",
        )


def read_requests(stream: BinaryIO, inbox: queue.Queue[InboxItem], done: threading.Event) -> None:
    """Reader thread body: frames to the inbox until EOF or a broken frame, then CHANNEL_CLOSED."""
    try:
        while (payload := read_frame(stream)) is not None:
            inbox.put(model_host_pb2.HostRequest.FromString(payload))
    except (FrameError, DecodeError, OSError) as exc:
        logger.error("model host channel broken: %s", exc)
    inbox.put(CHANNEL_CLOSED)
    if not done.wait(timeout=CHANNEL_CLOSED_GRACE_S):
        logger.error("channel closed while a forward pass was still running; exiting")
        os._exit(EXIT_CHANNEL_CLOSED)


class EmbedServer:
    """Answers embed requests until Shutdown or channel close; `serve` returns the exit code."""

    def __init__(
        self,
        *,
        encoder: Encoder,
        settings: ServingSettings,
        inbox: queue.Queue[InboxItem],
        responses: BinaryIO,
    ) -> None:
        self._encoder = encoder
        self._settings = settings
        self._inbox = inbox
        self._responses = responses
        # A frame taken off the inbox that did not fit the current batch; it starts the next one.
        self._carried: collections.deque[InboxItem] = collections.deque()
        self._tracer = tracer("gantry.model_host")

    def serve(self) -> int:
        while True:
            item = self._carried.popleft() if self._carried else self._inbox.get()
            if isinstance(item, _ChannelClosed):
                logger.info("channel closed by the parent; exiting")
                flush_tracing()
                return 0
            kind = item.WhichOneof("kind")
            if kind == "shutdown":
                logger.info("shutdown requested; exiting")
                flush_tracing()
                return 0
            if kind == "embed":
                if not item.embed.inputs:
                    self._answer_failure(
                        item, GantryError("INVALID_PAYLOAD", "embed request has no inputs")
                    )
                    continue
                self._run_batch(self._collect_batch(item))
                continue
            # Unknown variants are errors, never ignored (a second load included).
            self._answer_failure(
                item, GantryError("INVALID_PAYLOAD", f"unexpected model host request {kind!r}")
            )

    def _collect_batch(self, first: model_host_pb2.HostRequest) -> list[model_host_pb2.HostRequest]:
        batch = [first]
        total_inputs = len(first.embed.inputs)
        deadline = time.monotonic() + BATCH_WAIT_S
        while total_inputs < self._settings.max_batch_inputs:
            remaining = deadline - time.monotonic()
            try:
                # Past the deadline, still take what is already queued, without waiting.
                if remaining > 0:
                    item = self._inbox.get(timeout=remaining)
                else:
                    item = self._inbox.get_nowait()
            except queue.Empty:
                break
            fits = (
                isinstance(item, model_host_pb2.HostRequest)
                and item.WhichOneof("kind") == "embed"
                and 0 < len(item.embed.inputs) <= self._settings.max_batch_inputs - total_inputs
            )
            if not fits:
                self._carried.append(item)
                break
            assert isinstance(item, model_host_pb2.HostRequest)
            batch.append(item)
            total_inputs += len(item.embed.inputs)
        return batch

    def _run_batch(self, batch: list[model_host_pb2.HostRequest]) -> None:
        inputs = [text for request in batch for text in request.embed.inputs]
        spans = [
            self._tracer.start_span(
                "model_host.embed",
                context=extract_context(request.trace_context),
                attributes={
                    "gantry.input_count": len(request.embed.inputs),
                    "gantry.batch_requests": len(batch),
                    "gantry.batch_inputs": len(inputs),
                },
            )
            for request in batch
        ]
        try:
            vectors = self._encode(inputs)
        except Exception as exc:
            if len(batch) > 1:
                # One bad request must not fail its batch-mates: retry each on its own.
                logger.warning("batched forward pass failed (%s); retrying one by one", exc)
                for request, span in zip(batch, spans, strict=True):
                    self._run_single(request, span)
                return
            self._fail(batch[0], spans[0], exc)
            return
        offset = 0
        for request, span in zip(batch, spans, strict=True):
            count = len(request.embed.inputs)
            self._answer_vectors(request, span, vectors[offset : offset + count])
            offset += count

    def _run_single(self, request: model_host_pb2.HostRequest, span: trace.Span) -> None:
        try:
            vectors = self._encode(list(request.embed.inputs))
        except Exception as exc:
            self._fail(request, span, exc)
            return
        self._answer_vectors(request, span, vectors)

    def _encode(self, inputs: list[str]) -> np.ndarray:
        if self._settings.test_hooks:
            self._apply_test_hooks(inputs)
        vectors = self._encoder.encode(
            inputs,
            batch_size=self._settings.max_batch_inputs,
            convert_to_numpy=True,
            normalize_embeddings=self._settings.normalize,
            show_progress_bar=False,
        )
        if vectors.ndim != 2 or vectors.shape[0] != len(inputs):
            raise RuntimeError(f"encoder returned shape {vectors.shape} for {len(inputs)} inputs")
        return np.ascontiguousarray(vectors, dtype="<f4")

    @staticmethod
    def _apply_test_hooks(inputs: Sequence[str]) -> None:
        if TEST_HOOK_HANG_INPUT in inputs:
            logger.warning("test hook: hanging the forward pass")
            threading.Event().wait()
        if TEST_HOOK_FAIL_INPUT in inputs:
            raise RuntimeError("test hook: forced forward pass failure")

    def _answer_vectors(
        self, request: model_host_pb2.HostRequest, span: trace.Span, vectors: np.ndarray
    ) -> None:
        result = worker_gateway_pb2.EmbedResult(
            count=vectors.shape[0], dim=vectors.shape[1], float32_le=vectors.tobytes(order="C")
        )
        span.end()
        self._send(model_host_pb2.HostResponse(request_id=request.request_id, embed=result))

    def _fail(self, request: model_host_pb2.HostRequest, span: trace.Span, exc: Exception) -> None:
        logger.exception("forward pass failed for request %d", request.request_id)
        span.record_exception(exc)
        span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
        span.end()
        error = GantryError("INVOKE_FAILED", f"forward pass failed: {type(exc).__name__}: {exc}")
        self._answer_failure(request, error)

    def _answer_failure(self, request: model_host_pb2.HostRequest, error: GantryError) -> None:
        self._send(
            model_host_pb2.HostResponse(request_id=request.request_id, failure=error.to_failure())
        )

    def _send(self, response: model_host_pb2.HostResponse) -> None:
        # A broken pipe means the parent is gone; the caller's loop ends on CHANNEL_CLOSED.
        try:
            write_frame(self._responses, response)
        except OSError as exc:
            logger.error("cannot answer request %d: %s", response.request_id, exc)

"""The model host's serving loop: the main thread runs the adapter's requests, one at a time.

Embeds are micro-batched; reranks, health checks, probe checks, media requests (transcriptions,
text recognition, image embeddings and classifications: `media_serving`) and generations
(`generation_serving`, streamed and cancellable between tokens) run alone. Frames arrive
through the reader thread's `Inbox` (which answers pings itself). A request whose timeout passed
while it was queued, or that its caller cancelled, is never run. A request kind the adapter does
not serve is answered INVALID_PAYLOAD. Shutdown releases the model and answers HostUnloaded before
exiting.
"""

from __future__ import annotations

import _socket
import collections
import errno
import json
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from google.protobuf import timestamp_pb2
from opentelemetry import trace

from gantry.common.errors import GantryError
from gantry.common.telemetry import extract_context, flush_tracing, tracer
from gantry.v1 import model_host_pb2, worker_gateway_pb2
from gantry.worker.model_host import probe_evidence
from gantry.worker.model_host.adapters import ModelAdapter
from gantry.worker.model_host.adapters.base import DEFAULT_MAX_BATCH_INPUTS
from gantry.worker.model_host.generation_serving import GENERATE_KIND, GenerateRequests
from gantry.worker.model_host.inbox import ChannelClosed, Inbox, InboxItem, Queued, ResponseWriter
from gantry.worker.model_host.input_lengths import length_refusal
from gantry.worker.model_host.media_serving import MEDIA_KINDS, MediaRequests
from gantry.worker.model_host.probe_evidence import LoadRecord

logger = logging.getLogger("gantry.model_host")

# The request kinds an adapter answers (or refuses by kind, INVALID_PAYLOAD): `ModelAdapter.serves`.
SERVED_KINDS = frozenset({"embed", "rerank", GENERATE_KIND}) | MEDIA_KINDS

# Test hooks, honoured only when GANTRY_MODEL_HOST_TEST_HOOKS=1: an input equal to one of these
# makes the forward pass hang (so a test can kill the child mid-request), take a while, or fail.
TEST_HOOKS_ENV = "GANTRY_MODEL_HOST_TEST_HOOKS"
TEST_HOOK_HANG_INPUT = "__gantry_test_hook__:hang"
TEST_HOOK_FAIL_INPUT = "__gantry_test_hook__:fail"
TEST_HOOK_SLOW_INPUT = "__gantry_test_hook__:slow"
TEST_HOOK_SLOW_S = 1.5
# `<prefix><path>:<port>`: from inside the host, try to read `path` and to open a TCP connection to
# 127.0.0.1:`port` below the Python-level guard; the forward pass fails with a JSON report
# (`TEST_HOOK_PROBE_MARKER` then the JSON) of both outcomes, the cwd, environment and sys.path.
TEST_HOOK_PROBE_SANDBOX_PREFIX = "__gantry_test_hook__:probe-sandbox:"
TEST_HOOK_PROBE_MARKER = "sandbox probe: "


def _attempt(action: Callable[[], object]) -> str:
    try:
        action()
    except OSError as exc:
        return f"denied {errno.errorcode.get(exc.errno or 0, exc.errno)}"
    return "allowed"


def _probe_sandbox(path: str, port: int) -> dict[str, object]:
    def read() -> object:
        with open(path, "rb") as handle:
            return handle.read()

    def connect() -> None:
        # `_socket` directly: the kernel's answer, not the Python-level guard's.
        probe = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        try:
            probe.settimeout(5)
            probe.connect(("127.0.0.1", port))
        finally:
            probe.close()

    return {
        "read": _attempt(read),
        "connect": _attempt(connect),
        "cwd": os.getcwd(),
        # Not /proc/<pid>/environ: setproctitle reuses that memory for the process title.
        "environ": dict(os.environ),
        "sys_path": list(sys.path),
        "isolated_flag": sys.flags.isolated,
    }


@dataclass(frozen=True, kw_only=True)
class ServingSettings:
    max_batch_inputs: int
    test_hooks: bool

    @classmethod
    def from_adapter(cls, adapter: object) -> ServingSettings:
        max_batch_size = int(getattr(adapter, "max_batch_size", 0))
        return cls(
            max_batch_inputs=max_batch_size or DEFAULT_MAX_BATCH_INPUTS,
            test_hooks=os.environ.get(TEST_HOOKS_ENV) == "1",
        )


class ModelServer:
    """Answers the adapter's requests, health and probe checks until Shutdown or channel close;
    `serve` returns the exit code."""

    def __init__(
        self,
        *,
        deployment_id: str,
        adapter: ModelAdapter,
        record: LoadRecord,
        settings: ServingSettings,
        inbox: Inbox,
        responses: ResponseWriter,
    ) -> None:
        self._deployment_id = deployment_id
        self._adapter = adapter
        self._record = record
        self._settings = settings
        self._inbox = inbox
        self._responses = responses
        # A frame taken off the inbox that did not fit the current batch; it starts the next one.
        self._carried: collections.deque[InboxItem] = collections.deque()
        self._tracer = tracer("gantry.model_host")
        self._media = MediaRequests(
            adapter=adapter, responses=responses, tracer=self._tracer, fail=self._fail
        )
        self._generations = GenerateRequests(
            adapter=adapter,
            inbox=inbox,
            responses=responses,
            tracer=self._tracer,
            fail=self._fail,
            test_hooks=settings.test_hooks,
        )

    def serve(self) -> int:
        while True:
            item = self._carried.popleft() if self._carried else self._inbox.get()
            if isinstance(item, ChannelClosed):
                # Nobody is left to hear a HostUnloaded; the process's exit releases the model.
                logger.info("channel closed by the parent; exiting")
                flush_tracing()
                return 0
            kind = item.kind
            request = item.request
            if kind == "shutdown":
                logger.info("shutdown requested; releasing the model and exiting")
                self._unload(request)
                flush_tracing()
                return 0
            if not self._still_wanted(item):
                continue
            if kind in SERVED_KINDS and kind not in self._adapter.serves:
                self._answer_failure(request, self._wrong_kind(kind))
                continue
            if kind == "embed":
                if not request.embed.inputs:
                    self._answer_failure(
                        request, GantryError("INVALID_PAYLOAD", "embed request has no inputs")
                    )
                    continue
                if self._refused_for_length(request):
                    continue
                self._run_batch(self._collect_batch(request))
                continue
            if kind == "rerank":
                self._run_rerank(request)
                continue
            if kind in MEDIA_KINDS:
                self._media.run(request)
                continue
            if kind == GENERATE_KIND:
                self._generations.run(request)
                continue
            if kind == "health":
                self._answer_health(request)
                continue
            if kind == "probe_check":
                self._answer_probe(request)
                continue
            # Unknown variants are errors, never ignored (a second load included).
            self._answer_failure(
                request, GantryError("INVALID_PAYLOAD", f"unexpected model host request {kind!r}")
            )

    def _wrong_kind(self, kind: str) -> GantryError:
        adapter = self._adapter
        return GantryError(
            "INVALID_PAYLOAD",
            f"deployment {self._deployment_id} runs adapter {adapter.name!r} ({adapter.task}); "
            f"it cannot answer {kind} requests",
            deployment_id=self._deployment_id,
            adapter=adapter.name,
        )

    def _still_wanted(self, item: Queued) -> bool:
        """False (after answering, where someone still listens) for cancelled or expired work."""
        request_id = item.request.request_id
        if self._inbox.take_cancelled(request_id):
            # The caller went away and was told so by the parent: nobody waits for an answer.
            logger.info("dropped cancelled request %d before running it", request_id)
            return False
        if item.expired(time.monotonic()):
            logger.info("dropped expired request %d before running it", request_id)
            self._answer_failure(
                item.request,
                GantryError(
                    "DEADLINE_EXCEEDED",
                    f"request {request_id} waited past its {item.request.timeout_ms} ms timeout "
                    "in the model host's inbox and was not run",
                ),
            )
            return False
        return True

    def _collect_batch(self, first: model_host_pb2.HostRequest) -> list[model_host_pb2.HostRequest]:
        """`first` and the embeds already queued behind it, up to the batch bound.

        Adaptive, with no timer: an idle host runs a lone request at once (waiting for company
        would only add latency), and while a forward pass runs, concurrent callers queue up in the
        inbox and become the next batch. Under load batches fill by themselves.
        """
        batch = [first]
        total_inputs = len(first.embed.inputs)
        while total_inputs < self._settings.max_batch_inputs:
            try:
                item = self._inbox.get(timeout=0)
            except queue.Empty:
                break
            fits = (
                isinstance(item, Queued)
                and item.kind == "embed"
                and 0
                < len(item.request.embed.inputs)
                <= self._settings.max_batch_inputs - total_inputs
            )
            if not fits:
                self._carried.append(item)
                break
            assert isinstance(item, Queued)
            if not self._still_wanted(item) or self._refused_for_length(item.request):
                continue
            batch.append(item.request)
            total_inputs += len(item.request.embed.inputs)
        return batch

    def _refused_for_length(self, request: model_host_pb2.HostRequest) -> bool:
        """True (after answering INPUT_TOO_LONG) for an input past the model's token limit.

        Checked per request before batching: each request's own indexes, and one request's
        overlong input never fails its batch-mates."""
        try:
            refusal = length_refusal(self._adapter, request)
        except Exception as exc:
            logger.exception("counting the tokens of request %d failed", request.request_id)
            refusal = GantryError(
                "INVOKE_FAILED", f"counting tokens failed: {type(exc).__name__}: {exc}"
            )
        if refusal is None:
            return False
        self._answer_failure(request, refusal)
        return True

    # -- health, probe, unload -------------------------------------------------------------------

    def _answer_health(self, request: model_host_pb2.HostRequest) -> None:
        started = time.monotonic()
        model_layer = self.probe_model()
        checked_at = timestamp_pb2.Timestamp()
        checked_at.GetCurrentTime()
        report = worker_gateway_pb2.HealthReport(
            model=model_layer, latency_seconds=time.monotonic() - started, checked_at=checked_at
        )
        self._responses.send(
            model_host_pb2.HostResponse(request_id=request.request_id, health=report)
        )

    def probe_model(self) -> worker_gateway_pb2.HealthLayer:
        """One real forward pass on the adapter's probe input: finite, non-empty, expected shape."""
        check = probe_evidence.run_check(self._adapter)
        if not check.ok:
            logger.error("health probe failed: %s", check.problem)
        return probe_evidence.model_layer(check)

    def _answer_probe(self, request: model_host_pb2.HostRequest) -> None:
        result = probe_evidence.probe_result(self._adapter, self._record)
        self._responses.send(
            model_host_pb2.HostResponse(request_id=request.request_id, probe=result)
        )

    def _unload(self, request: model_host_pb2.HostRequest) -> None:
        """Release the model, then say what CUDA still holds (the parent may not wait for it)."""
        try:
            unloaded = probe_evidence.unloaded(self._adapter, self._record.cuda)
        except Exception as exc:
            # The process exits next, which releases everything; the reading says what failed.
            logger.exception("releasing the model failed")
            unloaded = model_host_pb2.HostUnloaded()
            unloaded.cuda_allocated_after_unload.unavailable = (
                f"releasing the model failed: {type(exc).__name__}: {exc}"
            )
        self._responses.send(
            model_host_pb2.HostResponse(request_id=request.request_id, unloaded=unloaded)
        )

    # -- embed -----------------------------------------------------------------------------------

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
        return self._adapter.embed(inputs)

    def _answer_vectors(
        self, request: model_host_pb2.HostRequest, span: trace.Span, vectors: np.ndarray
    ) -> None:
        result = worker_gateway_pb2.EmbedResult(
            count=vectors.shape[0], dim=vectors.shape[1], float32_le=vectors.tobytes(order="C")
        )
        span.end()
        self._responses.send(
            model_host_pb2.HostResponse(request_id=request.request_id, embed=result)
        )

    # -- rerank ----------------------------------------------------------------------------------

    def _run_rerank(self, request: model_host_pb2.HostRequest) -> None:
        payload = request.rerank
        if not payload.query or not payload.documents:
            self._answer_failure(
                request,
                GantryError("INVALID_PAYLOAD", "a rerank request needs a query and documents"),
            )
            return
        if self._refused_for_length(request):
            return
        span = self._tracer.start_span(
            "model_host.rerank",
            context=extract_context(request.trace_context),
            attributes={"gantry.document_count": len(payload.documents)},
        )
        try:
            if self._settings.test_hooks:
                self._apply_test_hooks([payload.query, *payload.documents])
            scores = self._adapter.rerank(payload.query, list(payload.documents))
        except Exception as exc:
            self._fail(request, span, exc)
            return
        span.end()
        self._responses.send(
            model_host_pb2.HostResponse(
                request_id=request.request_id,
                rerank=worker_gateway_pb2.RerankResult(scores=scores.tolist()),
            )
        )

    # -- shared ----------------------------------------------------------------------------------

    @staticmethod
    def _apply_test_hooks(inputs: Sequence[str]) -> None:
        if TEST_HOOK_HANG_INPUT in inputs:
            logger.warning("test hook: hanging the forward pass")
            threading.Event().wait()
        if TEST_HOOK_SLOW_INPUT in inputs:
            logger.warning("test hook: slow forward pass")
            time.sleep(TEST_HOOK_SLOW_S)
        if TEST_HOOK_FAIL_INPUT in inputs:
            raise RuntimeError("test hook: forced forward pass failure")
        for text in inputs:
            if text.startswith(TEST_HOOK_PROBE_SANDBOX_PREFIX):
                path, _, port = text.removeprefix(TEST_HOOK_PROBE_SANDBOX_PREFIX).rpartition(":")
                report = json.dumps(_probe_sandbox(path, int(port)), sort_keys=True)
                raise RuntimeError(f"{TEST_HOOK_PROBE_MARKER}{report}")

    def _fail(self, request: model_host_pb2.HostRequest, span: trace.Span, exc: Exception) -> None:
        logger.exception("forward pass failed for request %d", request.request_id)
        span.record_exception(exc)
        span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
        span.end()
        error = (
            exc
            if isinstance(exc, GantryError)
            else GantryError("INVOKE_FAILED", f"forward pass failed: {type(exc).__name__}: {exc}")
        )
        self._answer_failure(request, error)

    def _answer_failure(self, request: model_host_pb2.HostRequest, error: GantryError) -> None:
        self._responses.fail(request, error)

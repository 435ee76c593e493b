"""The model host's serving loop: the main thread runs the adapter's requests, one at a time.

Embeds are micro-batched and run in chunks of at most the batch bound (`max_batch_inputs`, the
profile's batch size): one chunk is one uninterruptible forward pass, and between two chunks the
host stops the requests of the batch that were cancelled or passed their timeout meanwhile. So
abandoned work holds the model for one chunk at most, however many inputs it had. A rerank runs
alone, its documents in chunks of the same bound, stopped the same way. Health checks, probe
checks, media requests (transcriptions, text recognition, image embeddings and classifications:
`media_serving`) and generations (`generation_serving`, streamed and cancellable between tokens)
run alone. Frames arrive through the reader thread's `Inbox` (which answers pings itself). A
request whose timeout passed while it was queued, or that its caller cancelled, is never run, and
an embed's or rerank's remaining chunks are not run once either happens. A request kind the
adapter does not serve is answered INVALID_PAYLOAD. Shutdown releases the model and answers
HostUnloaded before exiting.
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
from dataclasses import dataclass, field

import numpy as np
from google.protobuf import timestamp_pb2
from opentelemetry import trace

from gantry.common import operations
from gantry.common.errors import GantryError
from gantry.common.telemetry import extract_context, flush_tracing, tracer
from gantry.v1 import model_host_pb2, worker_gateway_pb2
from gantry.worker.model_host import cuda_oom, probe_evidence, testing_hooks
from gantry.worker.model_host.adapters import ModelAdapter
from gantry.worker.model_host.adapters.base import DEFAULT_MAX_BATCH_INPUTS
from gantry.worker.model_host.environments import TEST_HOOKS_VARIABLE as TEST_HOOKS_ENV
from gantry.worker.model_host.generation_serving import GENERATE_KIND, GenerateRequests
from gantry.worker.model_host.inbox import (
    ChannelClosed,
    Inbox,
    InboxItem,
    Queued,
    ResponseWriter,
    Woken,
)
from gantry.worker.model_host.input_lengths import length_refusal
from gantry.worker.model_host.media_serving import MediaRequests
from gantry.worker.model_host.pass_lanes import (
    PassLanes,
    lane_batch_inputs,
    least_beside_inputs,
    use_lane,
)
from gantry.worker.model_host.pass_threads import PassThreads
from gantry.worker.model_host.probe_evidence import LoadRecord

logger = logging.getLogger("gantry.model_host")

# The request kinds an adapter answers (or refuses by kind, INVALID_PAYLOAD): `ModelAdapter.serves`,
# one per inference operation (gantry.common.operations).
SERVED_KINDS = operations.KINDS

# Test hooks, on only in hosts a test starts with `HostLaunchSpec(test_hooks=True)` (which sets
# TEST_HOOKS_ENV in that child alone): an input equal to one of these makes the forward pass hang
# (so a test can kill the child mid-request), take a while, or fail. Those of the GPU and evidence
# paths (a fake CUDA OOM, ...) are in `testing_hooks`.
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
    # The batch bound: at most this many inputs are collected into one batch, and one chunk (one
    # uninterruptible forward pass) of a running batch holds at most this many.
    max_batch_inputs: int
    test_hooks: bool

    @classmethod
    def from_adapter(cls, adapter: object) -> ServingSettings:
        max_batch_size = int(getattr(adapter, "max_batch_size", 0))
        return cls(
            max_batch_inputs=max_batch_size or DEFAULT_MAX_BATCH_INPUTS,
            test_hooks=os.environ.get(TEST_HOOKS_ENV) == "1",
        )


def plan_chunk(remaining: Sequence[int], size: int) -> list[tuple[int, int]]:
    """The next chunk of a running batch: (request's index, how many of its next inputs), in the
    batch's order, `size` inputs at most. `remaining` is each request's inputs not yet run."""
    plan: list[tuple[int, int]] = []
    for index, left in enumerate(remaining):
        take = min(left, size)
        if take > 0:
            plan.append((index, take))
            size -= take
    return plan


@dataclass(eq=False)
class _EmbedJob:
    """One embed request's progress through a running batch: the vectors of its chunks so far."""

    item: Queued
    span: trace.Span
    chunks: list[np.ndarray] = field(default_factory=list)
    ran: int = 0  # inputs already run
    over: bool = False  # answered (vectors or failure) or abandoned

    @property
    def request(self) -> model_host_pb2.HostRequest:
        return self.item.request

    @property
    def remaining(self) -> int:
        return 0 if self.over else len(self.request.embed.inputs) - self.ran

    def next_inputs(self, count: int) -> list[str]:
        return list(self.request.embed.inputs[self.ran : self.ran + count])

    def add(self, vectors: np.ndarray) -> None:
        self.chunks.append(vectors)
        self.ran += vectors.shape[0]


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
        lanes: PassLanes | None = None,
    ) -> None:
        """`lanes`: where embed batches run side by side under load (pass_lanes.py;
        `PassLanes.for_adapter` says whether a host gets them); None runs every pass on the
        serving loop's thread."""
        self._deployment_id = deployment_id
        self._adapter = adapter
        self._record = record
        self._settings = settings
        self._inbox = inbox
        self._responses = responses
        # A frame taken off the inbox that did not fit the current batch; it starts the next one.
        self._carried: collections.deque[InboxItem] = collections.deque()
        self._tracer = tracer("gantry.model_host")
        self._pass_threads = PassThreads.for_adapter(adapter)
        self._lanes = lanes
        if self._lanes is not None:
            self._lanes.on_pass_end(self._lane_pass_ended)
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
        # The request kinds with a way of running of their own: embeds are batched (and keep their
        # timeouts while running), a generation streams; the checks run the adapter's probe.
        self._runners: dict[str, Callable[[Queued], None]] = {
            "embed": self._run_embed,
            "rerank": self._run_rerank,
            GENERATE_KIND: _of_request(self._generations.run),
            "health": _of_request(self._answer_health),
            "probe_check": _of_request(self._answer_probe),
        }

    def serve(self) -> int:
        while True:
            item = self._carried.popleft() if self._carried else self._inbox.get()
            runs_alone = isinstance(item, ChannelClosed) or item.kind != "embed"
            if self._lanes is not None and runs_alone:
                # Only embeds share the model; everything else runs alone (or ends the host).
                self._lanes.wait_idle()
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
            # Every operation but the batched and streamed ones runs alone (media_serving).
            media = _of_request(self._media.run) if kind in SERVED_KINDS else None
            run = self._runners.get(kind or "", media)
            if run is None:
                # Unknown variants are errors, never ignored (a second load included).
                self._answer_failure(
                    request,
                    GantryError("INVALID_PAYLOAD", f"unexpected model host request {kind!r}"),
                )
                continue
            run(item)

    def _run_embed(self, item: Queued) -> None:
        request = item.request
        if not request.embed.inputs:
            self._answer_failure(
                request, GantryError("INVALID_PAYLOAD", "embed request has no inputs")
            )
            return
        if self._refused_for_length(request):
            return
        if self._lanes is not None:
            # Collected once a lane is free, as late as it can be: the fuller for it.
            self._lanes.wait_free()
            bound = lane_batch_inputs(self._settings.max_batch_inputs)
            least = least_beside_inputs(self._settings.max_batch_inputs)
            batch = self._collect_batch(item, bound, least=least)
            if use_lane(requests=len(batch), running=self._lanes.running):
                self._lanes.submit(lambda: self._run_batch(batch, bound))
                return
        else:
            batch = self._collect_batch(item)
        if self._pass_threads is None:
            self._run_batch(batch)
            return
        self._pass_threads.before_pass(
            len(batch), sum(len(item.request.embed.inputs) for item in batch)
        )
        try:
            self._run_batch(batch)
        finally:
            self._pass_threads.after_pass()

    def _wrong_kind(self, kind: str) -> GantryError:
        adapter = self._adapter
        return GantryError(
            "INVALID_PAYLOAD",
            f"deployment {self._deployment_id} runs adapter {adapter.name!r} ({adapter.task}); "
            f"it cannot answer {kind} requests",
            deployment_id=self._deployment_id,
            adapter=adapter.name,
        )

    def _still_wanted(self, item: Queued, *, ran: tuple[int, int] | None = None) -> bool:
        """False (after answering, where someone still listens) for cancelled or expired work;
        `ran` is (inputs already run, inputs in all) of a request run in chunks, None before it
        starts."""
        request_id = item.request.request_id
        if ran is not None:
            where = f"after {ran[0]} of its {ran[1]} inputs"
            verb, timed_out = (
                "stopped",
                f"ran past its {{}} ms timeout {where}; the rest were not run",
            )
        else:
            where = "before running it"
            verb, timed_out = "dropped", "waited past its {} ms timeout in the model host's inbox"
            timed_out += " and was not run"
        if self._inbox.take_cancelled(request_id):
            # The caller went away and was told so by the parent: nobody waits for an answer.
            logger.info("%s cancelled request %d %s", verb, request_id, where)
            return False
        if item.expired(time.monotonic()):
            logger.info("%s expired request %d %s", verb, request_id, where)
            message = f"request {request_id} " + timed_out.format(item.request.timeout_ms)
            self._answer_failure(item.request, GantryError("DEADLINE_EXCEEDED", message))
            return False
        return True

    def _collect_batch(
        self, first: Queued, bound: int | None = None, *, least: int = 0
    ) -> list[Queued]:
        """`first` and the embeds already queued behind it, up to the batch bound (`bound`, a
        lane's, where given).

        Adaptive, with no timer: an idle host runs a lone request at once (waiting for company
        would only add latency), and while a forward pass runs, concurrent callers queue up in the
        inbox and become the next batch. Under load batches fill by themselves. With `least`, a
        batch that would start beside a running lane's pass waits for that many inputs, or for
        the pass to end, whichever comes first (pass_lanes.least_beside_inputs says why).
        """
        bound = bound or self._settings.max_batch_inputs
        batch = [first]
        total_inputs = len(first.request.embed.inputs)
        while total_inputs < bound:
            try:
                item = self._next_for_batch(waits=total_inputs < least)
            except queue.Empty:
                break
            if isinstance(item, Woken):
                continue  # a lane's pass ended: _next_for_batch checks again whether one runs
            fits = (
                isinstance(item, Queued)
                and item.kind == "embed"
                and 0 < len(item.request.embed.inputs) <= bound - total_inputs
            )
            if not fits:
                self._carried.append(item)
                break
            assert isinstance(item, Queued)
            if not self._still_wanted(item) or self._refused_for_length(item.request):
                continue
            batch.append(item)
            total_inputs += len(item.request.embed.inputs)
        return batch

    def _next_for_batch(self, *, waits: bool) -> InboxItem | Woken:
        """The next queued frame for a batch being collected: waited for while `waits` and a
        lane's pass runs (until a frame comes or a pass ends), else only one already queued
        (queue.Empty when there is none)."""
        if waits and self._lanes is not None and self._lanes.running:
            return self._inbox.get_or_woken()
        return self._inbox.get(timeout=0)

    def _lane_pass_ended(self) -> None:
        """A lane's batch ended, the lane already free: the host's idle clock, and a wake for a
        batch waiting for company beside that pass (`_collect_batch`)."""
        if self._pass_threads is not None:
            self._pass_threads.after_lane_pass()
        self._inbox.wake()

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

    def _run_batch(self, batch: list[Queued], chunk_inputs: int | None = None) -> None:
        """Run the batch's inputs chunk by chunk (`plan_chunk`, at most `chunk_inputs` each: the
        batch bound, or a lane's), answering each request once its last chunk ran; before each
        chunk, requests cancelled or past their timeout are stopped."""
        size = chunk_inputs or self._settings.max_batch_inputs
        inputs = sum(len(item.request.embed.inputs) for item in batch)
        jobs = [
            _EmbedJob(item, self._embed_span(item.request, len(batch), inputs)) for item in batch
        ]
        while jobs := [job for job in jobs if job.remaining and self._job_wanted(job)]:
            plan = plan_chunk([job.remaining for job in jobs], size)
            self._run_chunk([(jobs[index], count) for index, count in plan])

    def _embed_span(
        self, request: model_host_pb2.HostRequest, requests: int, inputs: int
    ) -> trace.Span:
        return self._tracer.start_span(
            "model_host.embed",
            context=extract_context(request.trace_context),
            attributes={
                "gantry.input_count": len(request.embed.inputs),
                "gantry.batch_requests": requests,
                "gantry.batch_inputs": inputs,
            },
        )

    def _job_wanted(self, job: _EmbedJob) -> bool:
        wanted = self._still_wanted(
            job.item, ran=(job.ran, len(job.request.embed.inputs)) if job.ran else None
        )
        if wanted:
            return True
        job.over = True
        job.span.set_attribute("gantry.abandoned_after_inputs", job.ran)
        job.span.end()
        return False

    def _run_chunk(self, parts: list[tuple[_EmbedJob, int]]) -> None:
        """One forward pass over the next `count` inputs of each job in `parts`."""
        try:
            vectors = self._encode(
                [text for job, count in parts for text in job.next_inputs(count)]
            )
        except Exception as exc:
            if len(parts) > 1:
                # One bad request must not fail its batch-mates: retry each on its own (after a
                # CUDA OOM, with the failed pass's memory handed back: each alone may fit).
                logger.warning("batched forward pass failed (%s); retrying one by one", exc)
                if cuda_oom.is_cuda_oom(exc):
                    cuda_oom.release_after(exc)
                for job, count in parts:
                    self._run_chunk([(job, count)])
                return
            job = parts[0][0]
            job.over = True
            self._fail(job.request, job.span, exc)
            return
        offset = 0
        answers = []
        for job, count in parts:
            job.add(vectors[offset : offset + count])
            offset += count
            if not job.remaining:
                job.over = True
                answers.append(
                    self._vectors_answer(job.request, job.span, np.concatenate(job.chunks))
                )
        if answers:
            self._responses.send_all(answers)

    def _encode(self, inputs: list[str]) -> np.ndarray:
        if self._settings.test_hooks:
            self._apply_test_hooks(inputs)
        return self._adapter.embed(inputs)

    def _vectors_answer(
        self, request: model_host_pb2.HostRequest, span: trace.Span, vectors: np.ndarray
    ) -> model_host_pb2.HostResponse:
        """A request's answer (its span ended), sent by the caller with the pass's others."""
        result = worker_gateway_pb2.EmbedResult(
            count=vectors.shape[0], dim=vectors.shape[1], float32_le=vectors.tobytes(order="C")
        )
        span.end()
        return model_host_pb2.HostResponse(request_id=request.request_id, embed=result)

    # -- rerank ----------------------------------------------------------------------------------

    def _run_rerank(self, item: Queued) -> None:
        """Score the documents in chunks of at most the batch bound, like an embed's inputs: a
        request cancelled or past its timeout runs no chunk after the one in progress."""
        request = item.request
        payload = request.rerank
        if not payload.query or not payload.documents:
            self._answer_failure(
                request,
                GantryError("INVALID_PAYLOAD", "a rerank request needs a query and documents"),
            )
            return
        if self._refused_for_length(request):
            return
        documents = list(payload.documents)
        span = self._tracer.start_span(
            "model_host.rerank",
            context=extract_context(request.trace_context),
            attributes={"gantry.document_count": len(documents)},
        )
        chunks: list[np.ndarray] = []
        size = self._settings.max_batch_inputs
        try:
            for start in range(0, len(documents), size):
                if start and not self._still_wanted(item, ran=(start, len(documents))):
                    span.set_attribute("gantry.abandoned_after_inputs", start)
                    span.end()
                    return
                chunk = documents[start : start + size]
                if self._settings.test_hooks:
                    self._apply_test_hooks([payload.query, *chunk])
                chunks.append(self._adapter.rerank(payload.query, chunk))
        except Exception as exc:
            self._fail(request, span, exc)
            return
        span.end()
        self._responses.send(
            model_host_pb2.HostResponse(
                request_id=request.request_id,
                rerank=worker_gateway_pb2.RerankResult(scores=np.concatenate(chunks).tolist()),
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
        testing_hooks.apply(inputs)
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
        if isinstance(exc, GantryError):
            error = exc
        elif cuda_oom.is_cuda_oom(exc):
            # The request did not fit the envelope; the host did not break. Read the allocator
            # as the failure left it, hand the memory back, and serve the next call.
            error = cuda_oom.invoke_oom(exc, self._record.cuda)
            cuda_oom.release_after(exc)
        else:
            error = GantryError(
                "INVOKE_FAILED", f"forward pass failed: {type(exc).__name__}: {exc}"
            )
        self._answer_failure(request, error)

    def _answer_failure(self, request: model_host_pb2.HostRequest, error: GantryError) -> None:
        self._responses.fail(request, error)


def _of_request(
    run: Callable[[model_host_pb2.HostRequest], None],
) -> Callable[[Queued], None]:
    """A runner that needs only the request, not when it expires."""
    return lambda item: run(item.request)

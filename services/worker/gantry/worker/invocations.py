"""Invocations on the worker: bounded in flight, honouring the relative timeout, cancellable.

- At most `max_in_flight` invocations wait at once; one more is answered QUEUE_FULL at once.
- The timeout is `Invoke.timeout` (relative, so clocks need not agree); only when it is unset is the
  absolute `deadline` used, then a default. The model host learns it too and never runs a request
  that waited past it in its own queue.
- `CancelInvoke` stops the wait, tells the model host to drop the request if still queued (or
  to stop a generation between two tokens), and sends no InvokeResult (the caller is gone).
- A streamed generation's deltas go out as InvokeProgress, in order, before its InvokeResult. A
  delta the outbox refuses is not lost: its text is carried into the next one (one pending
  delta per invocation at most), and what is still pending goes out before the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

from gantry.common import operations
from gantry.common.errors import GantryError
from gantry.common.telemetry import extract_context, inject_context, tracer
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker import metrics
from gantry.worker.supervision import Supervisor

log = logging.getLogger(__name__)
_tracer = tracer("gantry.worker")

DEFAULT_MAX_IN_FLIGHT = 1024
DEFAULT_INVOKE_TIMEOUT_S = 30.0
# Sends one InvokeProgress to the control plane; False when it could not be queued.
EmitProgress = Callable[[wg.InvokeProgress], bool]


def invoke_timeout_s(invoke: wg.Invoke, *, now: float | None = None) -> float:
    """Seconds this invocation may take, from its relative timeout, else its deadline."""
    if invoke.HasField("timeout"):
        return invoke.timeout.ToTimedelta().total_seconds()
    if invoke.HasField("deadline"):
        current = time.time() if now is None else now
        return invoke.deadline.ToDatetime().timestamp() - current
    return DEFAULT_INVOKE_TIMEOUT_S


class ProgressRelay:
    """One streamed invocation's deltas on their way out, coalesced while the outbox is full."""

    def __init__(self, request_id: str, emit: EmitProgress) -> None:
        self._request_id = request_id
        self._emit = emit
        self._pending: wg.GenerateDelta | None = None

    def send(self, delta: wg.GenerateDelta) -> None:
        if self._pending is not None:
            delta = wg.GenerateDelta(
                text=self._pending.text + delta.text, completion_tokens=delta.completion_tokens
            )
        progress = wg.InvokeProgress(request_id=self._request_id, generate=delta)
        self._pending = None if self._emit(progress) else delta

    def flush(self) -> None:
        """Send what is still pending (before the result, which must come after it)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.send(pending)


class Invocations:
    def __init__(
        self,
        *,
        supervisor: Supervisor,
        emit: Callable[[wg.InvokeResult], None],
        emit_progress: EmitProgress | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        """`emit_progress` sends streamed deltas; without it a streamed generation's text comes
        only with its result."""
        self._supervisor = supervisor
        self._emit = emit
        self._emit_progress = emit_progress
        self._max_in_flight = max_in_flight
        self._in_flight: dict[str, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._in_flight)

    def start(
        self,
        invoke: wg.Invoke,
        trace_context: Mapping[str, str],
        *,
        emit: Callable[[wg.InvokeResult], None] | None = None,
        emit_progress: EmitProgress | None = None,
    ) -> None:
        """Run one invocation; its result (and progress) go through `emit` (`emit_progress`)
        when given, else this object's: a worker answers on the stream the call came on."""
        emit = emit or self._emit
        if len(self._in_flight) >= self._max_in_flight or invoke.request_id in self._in_flight:
            reason = (
                "QUEUE_FULL" if invoke.request_id not in self._in_flight else "INVALID_ARGUMENT"
            )
            message = (
                f"this worker already has {len(self._in_flight)} invocations in flight"
                if reason == "QUEUE_FULL"
                else f"invocation {invoke.request_id} is already in flight"
            )
            emit(
                wg.InvokeResult(
                    request_id=invoke.request_id, failure=GantryError(reason, message).to_failure()
                )
            )
            return
        task = asyncio.create_task(
            self._invoke(invoke, trace_context, emit, emit_progress or self._emit_progress),
            name="invoke",
        )
        self._in_flight[invoke.request_id] = task
        task.add_done_callback(lambda _: self._in_flight.pop(invoke.request_id, None))

    def cancel(self, request_id: str) -> bool:
        task = self._in_flight.get(request_id)
        if task is None:
            return False
        task.cancel()
        return True

    async def close(self) -> None:
        tasks = list(self._in_flight.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _invoke(
        self,
        invoke: wg.Invoke,
        trace_context: Mapping[str, str],
        emit: Callable[[wg.InvokeResult], None],
        emit_progress: EmitProgress | None,
    ) -> None:
        result = wg.InvokeResult(request_id=invoke.request_id)
        started = time.perf_counter()
        with _tracer.start_as_current_span(
            "worker.invoke",
            context=extract_context(trace_context),
            attributes={"gantry.deployment_id": invoke.deployment_id},
        ):
            try:
                await self._run(invoke, result, emit_progress)
            except GantryError as error:
                result.failure.CopyFrom(error.to_failure())
            except Exception as exc:
                log.exception("invoke %s failed unexpectedly", invoke.request_id)
                result.failure.CopyFrom(
                    GantryError("INVOKE_FAILED", f"{type(exc).__name__}").to_failure()
                )
        # A cancelled invoke raised CancelledError above and never gets here: no result.
        metrics.invocation_answered(
            result.failure.reason,
            time.perf_counter() - started,
            capability=invoke.capability,
            deployment_id=invoke.deployment_id,
        )
        emit(result)

    async def _run(
        self, invoke: wg.Invoke, result: wg.InvokeResult, emit_progress: EmitProgress | None
    ) -> None:
        """Hand the payload to the deployment's host; its answer goes into `result`.

        Whether this host's adapter does that kind of work is the host's to say: an embedding
        host asked to transcribe answers INVALID_PAYLOAD, the client's error."""
        kind = invoke.WhichOneof("payload")
        if kind not in operations.KINDS:
            raise GantryError(
                "INVALID_PAYLOAD",
                f"invocation {invoke.request_id} carries no payload this worker serves "
                f"({kind or 'none'})",
            )
        host = self._supervisor.host_for_invoke(invoke.deployment_id)
        timeout_s = invoke_timeout_s(invoke)
        if timeout_s <= 0:
            raise GantryError(
                "DEADLINE_EXCEEDED", f"invocation {invoke.request_id} arrived past its timeout"
            )
        child_context: dict[str, str] = {}
        inject_context(child_context)
        payload = getattr(invoke, kind)
        operation = operations.of_payload(payload)
        # A streamed generation's deltas go out as they come, when there is somewhere to send
        # them; otherwise its text comes only with its result.
        relay = (
            ProgressRelay(invoke.request_id, emit_progress)
            if operation.streaming and emit_progress is not None
            else None
        )
        answer = await host.invoke(
            kind,
            payload,
            trace_context=child_context,
            timeout_s=timeout_s,
            on_delta=relay.send if relay is not None else None,
        )
        if relay is not None:
            relay.flush()
        # The answer goes in its operation's outcome (an image embedding answers as `embed`).
        getattr(result, operation.result_kind).CopyFrom(answer)

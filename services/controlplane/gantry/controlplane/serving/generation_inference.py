"""Inference.Generate and GenerateStream: text generation on a transformers_causal_lm deployment.

Each call takes the path Embed takes (inference_service.py, invocation.py: the caller's tenant from
its key, the deployment from the binding, the scheduler's dispatch, the worker's model host) after
its checks (generation_validation.py). Once the deployment is known its adapter settings (read
once per deployment: they never change) bound the call's max_tokens, so a call that names none
gets what that deployment allows, the worker is always told how many tokens it may produce, and
the fair queue counts that much work. Whether a deployment generates is its model host's to say:
a Generate sent to an embedding deployment comes back INVALID_PAYLOAD, as the client's error.

GenerateStream asks the worker to stream: each GenerateDelta it sends before its result is
written to the client as one chunk, in the order sent, as it arrives; the last chunk carries the
finish reason, the token counts and where it ran. What waits for a slow client is bounded
(worker_sessions: CLIENT_TOO_SLOW past it). A client that goes away or runs out of time cancels
this handler wherever it waits, a write included: the worker is told to drop the invocation
(CancelInvoke) and the scheduler hears one WorkFinished, CANCELLED. The worker's result is checked
(generation_answers.py) before the work counts as finished.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import grpc

from gantry.common import operations
from gantry.common.auth import current_principal
from gantry.common.telemetry import tracer
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.nodes.sessions import OnProgress
from gantry.controlplane.platform import convert
from gantry.controlplane.platform.database import Database
from gantry.controlplane.serving.generation_answers import (
    checked_delta,
    checked_generation_result,
    checked_stream_result,
)
from gantry.controlplane.serving.generation_validation import CheckedGeneration, checked_generation
from gantry.controlplane.serving.inference_calls import CallBudget, InferenceSettings, Resolve
from gantry.controlplane.serving.invocation import Invocation
from gantry.v1 import common_pb2, inference_pb2
from gantry.v1 import worker_gateway_pb2 as wg

_tracer = tracer("gantry.controlplane")
# How long a failed stream waits for a write its client has not read yet before giving up on
# telling that client why (it may never read again; its deadline, if any, ends the call anyway).
WRITE_SETTLE_S = 30.0
_Answer = TypeVar("_Answer")
# Deployments whose adapter settings are kept; past it the cache starts over (a read each).
_ADAPTER_CACHE_LIMIT = 4096
# deployment id -> its adapter settings (max_new_tokens bounds a generation).
AdapterOf = Callable[[str], Awaitable[common_pb2.AdapterSettings]]


@dataclass(frozen=True, slots=True)
class _Served(Generic[_Answer]):
    deployment_id: str
    node_id: str
    answer: _Answer  # the worker's result, checked (generation_answers)


@dataclass
class _StreamedText:
    """Writes each delta's text to the client as a chunk, and keeps what it wrote (the result
    must be that text, whole)."""

    context: grpc.aio.ServicerContext
    written: list[str] = field(default_factory=list)
    _write: asyncio.Future[None] | None = None

    async def write(self, progress: wg.InvokeProgress) -> None:
        delta = checked_delta(progress)
        if not delta.text:
            return  # every chunk but the last carries text
        self.written.append(delta.text)
        self._write = asyncio.ensure_future(
            self.context.write(inference_pb2.GenerateChunk(text=delta.text))
        )
        # Shielded: a call that fails while its client reads nothing stops waiting here at once
        # (worker_sessions), but the write itself must end before gRPC can send any status.
        await asyncio.shield(self._write)

    async def settled(self) -> None:
        """Wait for a write still waiting on its client, at most WRITE_SETTLE_S: the call's
        failure can only be sent after it (gRPC takes one send at a time)."""
        if self._write is not None and not self._write.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._write), WRITE_SETTLE_S)
            self.abandon()  # still waiting: its client is not reading; nothing more is sent

    def abandon(self) -> None:
        """The call is gone (cancelled): so is any write of it."""
        if self._write is not None and not self._write.done():
            self._write.cancel()


class DeploymentAdapters:
    """A deployment's adapter settings, read from the database once: they are written when the
    deployment is created and never change."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self._adapters: dict[str, common_pb2.AdapterSettings] = {}

    async def __call__(self, deployment_id: str) -> common_pb2.AdapterSettings:
        adapter = self._adapters.get(deployment_id)
        if adapter is None:
            async with self._database.read() as session:
                deployment = await deployments.get_deployment(session, deployment_id)
            adapter = convert.adapter_from_json(deployment.adapter)
            if len(self._adapters) >= _ADAPTER_CACHE_LIMIT:
                self._adapters.clear()
            self._adapters[deployment_id] = adapter
        return adapter


class GenerationInference:
    """Generate's and GenerateStream's bodies; InferenceService counts each call and delegates."""

    def __init__(
        self,
        *,
        invoke: Invocation,
        resolve: Resolve,
        adapter_of: AdapterOf,
        settings: InferenceSettings,
    ) -> None:
        self._invoke = invoke
        self._resolve = resolve
        self._adapter_of = adapter_of
        self._settings = settings

    async def generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.GenerateResponse:
        checked = checked_generation(request, self._settings.limits, stream=False)
        served = await self._serve(
            operations.GENERATE,
            request,
            context,
            checked,
            answer=lambda result, max_tokens: checked_generation_result(
                result.generate, max_tokens=max_tokens
            ),
        )
        result = served.answer
        return inference_pb2.GenerateResponse(
            text=result.text,
            finish_reason=result.finish_reason,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            deployment_id=served.deployment_id,
            node_id=served.node_id,
        )

    async def generate_stream(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> None:
        checked = checked_generation(request, self._settings.limits, stream=True)
        streamed = _StreamedText(context)
        try:
            served = await self._serve(
                operations.GENERATE_STREAM,
                request,
                context,
                checked,
                answer=lambda result, max_tokens: checked_stream_result(
                    result.generate, streamed.written, max_tokens=max_tokens
                ),
                on_progress=streamed.write,
            )
        except asyncio.CancelledError:
            streamed.abandon()
            raise
        except BaseException:
            # The work is already reported finished (the scheduler is not kept waiting on a
            # client that reads nothing); its client hears why once its last write went out.
            await streamed.settled()
            raise
        result = served.answer
        await context.write(
            inference_pb2.GenerateChunk(
                finish_reason=result.finish_reason,
                prompt_tokens=result.prompt_tokens,
                completion_tokens=result.completion_tokens,
                deployment_id=served.deployment_id,
                node_id=served.node_id,
            )
        )

    async def _serve(
        self,
        operation: operations.Operation,
        request: inference_pb2.GenerateRequest,
        context: grpc.aio.ServicerContext,
        checked: CheckedGeneration,
        *,
        answer: Callable[[wg.InvokeResult, int], _Answer],
        on_progress: OnProgress | None = None,
    ) -> _Served[_Answer]:
        """Resolve the target, give the call its max_tokens there, and invoke the payload within
        the call's budget; the worker's result comes back as `answer` checked it (against that
        max_tokens), inside the invoke path."""
        tenant_id = current_principal().subject
        budget = CallBudget.of(
            context.time_remaining(), max_seconds=self._settings.max_invoke_seconds
        )
        attributes: Mapping[str, str | int] = {
            "gantry.tenant_id": tenant_id,
            "gantry.message_count": len(request.messages),
        }
        with _tracer.start_as_current_span(operation.span_name, attributes=attributes) as span:
            deployment_id = await self._resolve(operation.rpc, request)
            span.set_attribute("gantry.deployment_id", deployment_id)
            planned = checked.for_deployment(await self._adapter_of(deployment_id))
            span.set_attribute("gantry.max_tokens", planned.max_tokens)
            node_id, answered = await self._invoke(
                tenant_id=tenant_id,
                deployment_id=deployment_id,
                request=request,
                payload=planned.payload,
                budget=budget,
                answer=lambda result: answer(result, planned.max_tokens),
                cost=planned.cost,
                on_progress=on_progress,
            )
            return _Served(deployment_id=deployment_id, node_id=node_id, answer=answered)

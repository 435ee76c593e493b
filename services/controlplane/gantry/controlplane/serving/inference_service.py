"""The Inference front door: the caller's tenant from its key, the deployment from the binding or
its id, the scheduler's dispatch, the chosen worker's answer.

Its RPC methods are not written one by one: each registered operation
(`gantry.common.operations`) gets one, counted under its RPC's name, that serves it as its
control-plane binding says (`operations.py`): a unary operation through `_serve` (its checks,
payload, cost and answer from `PREPARED`), a generation through `generation_inference.py`. All
take the same path to a worker (invocation.py).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from gantry.common import operations as registry
from gantry.common.auth import current_principal
from gantry.common.clock import Clock
from gantry.common.telemetry import tracer
from gantry.controlplane.nodes.sessions import WorkerHub
from gantry.controlplane.platform import metrics
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.controlplane.serving.capability_degradation import CapabilityDegradation
from gantry.controlplane.serving.generation_inference import DeploymentAdapters, GenerationInference
from gantry.controlplane.serving.inference_calls import (
    DEFAULT_MAX_INVOKE_SECONDS,
    CallBudget,
    InferenceSettings,
    counted,
    work_outcome,
)
from gantry.controlplane.serving.invocation import Invocation, work_cost
from gantry.controlplane.serving.operations import PREPARED
from gantry.controlplane.serving.prepared_call import Prepare
from gantry.controlplane.serving.route_cache import RouteCache
from gantry.controlplane.serving.routing import DeploymentResolver, TargetedRequest
from gantry.controlplane.serving.text_answers import embedding_response, ranked
from gantry.v1 import inference_pb2_grpc

# Kept importable from here, where callers have always found them.
__all__ = [
    "DEFAULT_MAX_INVOKE_SECONDS",
    "CallBudget",
    "InferenceService",
    "InferenceSettings",
    "embedding_response",
    "ranked",
    "work_cost",
    "work_outcome",
]

_tracer = tracer("gantry.controlplane")
# One call's body: the request and its context -> the response (None for a stream it wrote).
Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


class InferenceService(inference_pb2_grpc.InferenceServicer):
    def __init__(
        self,
        *,
        # What resolves a call's deployment (and reads its adapter settings)...
        database: Database,
        routes: RouteCache,
        resolver: DeploymentResolver | None = None,
        # ...and what invokes it there (invocation.py).
        scheduler: SchedulerLink,
        hub: WorkerHub,
        clock: Clock,
        settings: InferenceSettings | None = None,
        degradation: CapabilityDegradation | None = None,
    ) -> None:
        self._settings = settings or InferenceSettings()
        self._resolver = resolver or DeploymentResolver(database=database, routes=routes)
        self._invoke = Invocation(
            hub=hub,
            scheduler=scheduler,
            clock=clock,
            settings=self._settings,
            degradation=degradation,
        )
        generation = GenerationInference(
            invoke=self._invoke,
            resolve=self._resolve,
            adapter_of=DeploymentAdapters(database),
            settings=self._settings,
        )
        # RPC -> its body: every unary operation's through _serve, the generations' their own.
        self._handlers: dict[str, Handler] = {
            **{
                rpc: self._unary(registry.by_rpc(rpc), prepare) for rpc, prepare in PREPARED.items()
            },
            registry.GENERATE.rpc: generation.generate,
            # A coroutine that writes, not an async generator: a client that goes away cancels
            # this task wherever it waits (a write included), so the invocation is cancelled at
            # once and not whenever an abandoned generator is collected.
            registry.GENERATE_STREAM.rpc: generation.generate_stream,
        }

    def _unary(self, operation: registry.Operation, prepare: Prepare) -> Handler:
        async def serve(request: Any, context: grpc.aio.ServicerContext) -> Message:
            return await self._serve(operation, prepare, request, context)

        return serve

    async def _serve(
        self,
        operation: registry.Operation,
        prepare: Prepare,
        request: Any,
        context: grpc.aio.ServicerContext,
    ) -> Message:
        """Check the request (its binding's `prepare`), resolve the target, and invoke the
        payload within the call's budget; the worker's result comes back as the binding's
        `answer` checked and shaped it, inside the invoke path, with where it ran."""
        call = prepare(request, self._settings.limits)
        tenant_id = current_principal().subject
        budget = CallBudget.of(
            context.time_remaining(), max_seconds=self._settings.max_invoke_seconds
        )
        with _tracer.start_as_current_span(
            operation.span_name, attributes={"gantry.tenant_id": tenant_id, **call.attributes}
        ) as span:
            deployment_id = await self._resolve(operation.rpc, request)
            span.set_attribute("gantry.deployment_id", deployment_id)
            node_id, response = await self._invoke(
                tenant_id=tenant_id,
                deployment_id=deployment_id,
                request=request,
                payload=call.payload,
                budget=budget,
                answer=call.answer,
                cost=call.cost,
            )
            response.deployment_id, response.node_id = deployment_id, node_id  # type: ignore[attr-defined]
            return response

    async def _resolve(self, operation: str, request: TargetedRequest) -> str:
        """capability | deployment_id -> a routable deployment, or a typed reason why not.

        By capability the binding alone decides (routing.py): never another deployment. From
        here on the call is counted under that deployment and its capability.
        """
        started = time.perf_counter()
        target = await self._resolver.resolve_target(request)
        metrics.call_resolved(target.capability, target.deployment_id)
        metrics.stage_finished(operation, metrics.STAGE_RESOLVE, time.perf_counter() - started)
        return target.deployment_id


def _rpc_method(operation: registry.Operation) -> Callable[..., Awaitable[Any]]:
    """InferenceService's method for `operation`: its body, counted under its RPC's name (the
    status and reason the client sees, validation errors included, and the whole latency)."""

    async def method(
        self: InferenceService, request: Message, context: grpc.aio.ServicerContext
    ) -> Any:
        return await counted(operation.rpc, self._handlers[operation.rpc](request, context))

    method.__name__ = method.__qualname__ = operation.rpc
    method.__doc__ = f"gantry.v1.Inference.{operation.rpc} ({operation.span_name})."
    return method


for _operation in registry.OPERATIONS:
    setattr(InferenceService, _operation.rpc, _rpc_method(_operation))

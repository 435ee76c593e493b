"""Inference.Embed: the front door. Caller's tenant from its key, route via the scheduler."""

from __future__ import annotations

import array
import datetime as dt
import sys
import time

import grpc
from google.protobuf import timestamp_pb2

from gantry.common.auth import current_principal
from gantry.common.clock import Clock
from gantry.common.errors import GantryError, invalid_argument
from gantry.common.ids import new_id, parse_id
from gantry.common.telemetry import inject_context, tracer
from gantry.controlplane.domain.transitions import DeploymentState
from gantry.controlplane.persistence import deployments
from gantry.controlplane.persistence.database import Database
from gantry.controlplane.route_cache import RouteCache
from gantry.controlplane.scheduler_link import SchedulerLink
from gantry.controlplane.worker_sessions import WorkerHub
from gantry.v1 import common_pb2, inference_pb2, inference_pb2_grpc, scheduler_pb2
from gantry.v1 import worker_gateway_pb2 as wg

_tracer = tracer("gantry.controlplane")

MAX_INPUTS = 1024
MAX_INPUT_CHARS = 100_000
DEFAULT_TIMEOUT_SECONDS = 30.0
_OUTCOME_BY_CLASS = {
    common_pb2.FAILURE_CLASS_INFRA: scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE,
    common_pb2.FAILURE_CLASS_REQUEST: scheduler_pb2.WORK_OUTCOME_REQUEST_FAILURE,
    common_pb2.FAILURE_CLASS_CONFIG: scheduler_pb2.WORK_OUTCOME_REQUEST_FAILURE,
}


def validate_inputs(inputs: list[str]) -> None:
    if not inputs:
        raise invalid_argument("inputs must hold at least one text", field="inputs")
    if len(inputs) > MAX_INPUTS:
        raise GantryError("INVALID_PAYLOAD", f"at most {MAX_INPUTS} inputs per call")
    for index, text in enumerate(inputs):
        if len(text) > MAX_INPUT_CHARS:
            raise GantryError(
                "INVALID_PAYLOAD", f"input {index} is longer than {MAX_INPUT_CHARS} characters"
            )


def vectors(
    result: wg.EmbedResult, encoding: inference_pb2.VectorEncoding
) -> list[inference_pb2.Vector]:
    row_bytes = result.dim * 4
    if len(result.float32_le) != row_bytes * result.count:
        raise GantryError("INVOKE_FAILED", "the worker returned a malformed embedding block")
    if encoding == inference_pb2.VECTOR_ENCODING_FLOAT32_LE_BYTES:
        return [
            inference_pb2.Vector(float32_le=result.float32_le[i * row_bytes : (i + 1) * row_bytes])
            for i in range(result.count)
        ]
    values = array.array("f")
    values.frombytes(result.float32_le)
    if sys.byteorder != "little":
        values.byteswap()
    return [
        inference_pb2.Vector(values=values[i * result.dim : (i + 1) * result.dim])
        for i in range(result.count)
    ]


class InferenceService(inference_pb2_grpc.InferenceServicer):
    def __init__(
        self,
        *,
        database: Database,
        hub: WorkerHub,
        scheduler: SchedulerLink,
        routes: RouteCache,
        clock: Clock,
    ) -> None:
        self._database = database
        self._routes = routes
        self._hub = hub
        self._scheduler = scheduler
        self._clock = clock

    async def Embed(
        self, request: inference_pb2.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EmbedResponse:
        tenant_id = current_principal().subject
        inputs = list(request.inputs)
        validate_inputs(inputs)
        remaining = context.time_remaining()
        timeout = min(remaining, DEFAULT_TIMEOUT_SECONDS) if remaining else DEFAULT_TIMEOUT_SECONDS
        started = time.monotonic()
        with _tracer.start_as_current_span(
            "controlplane.embed", attributes={"gantry.tenant_id": tenant_id}
        ) as span:
            deployment_id = await self._resolve(request)
            span.set_attribute("gantry.deployment_id", deployment_id)
            work_id = new_id()
            dispatch = await self._scheduler.dispatch(
                scheduler_pb2.WorkSubmitted(
                    work_id=work_id,
                    tenant_id=tenant_id,
                    priority=request.priority or common_pb2.PRIORITY_INTERACTIVE,
                    deployment_id=deployment_id,
                    capability=request.capability,
                ),
                timeout=timeout,
            )
            outcome = scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE
            try:
                trace_context: dict[str, str] = {}
                inject_context(trace_context)
                deadline = timestamp_pb2.Timestamp()
                deadline.FromDatetime(self._clock.now() + dt.timedelta(seconds=timeout))
                result = await self._hub.invoke_embed(
                    node_id=dispatch.node_id,
                    request_id=work_id,
                    deployment_id=deployment_id,
                    inputs=inputs,
                    timeout=max(0.1, timeout - (time.monotonic() - started)),
                    trace_context=trace_context,
                    deadline=deadline,
                )
                outcome = scheduler_pb2.WORK_OUTCOME_SUCCESS
            except GantryError as error:
                outcome = _OUTCOME_BY_CLASS[error.failure_class.value]
                raise
            finally:
                self._scheduler.work_finished(work_id, outcome)
            encoding = request.encoding or inference_pb2.VECTOR_ENCODING_FLOAT_LIST
            return inference_pb2.EmbedResponse(
                vectors=vectors(result, encoding),
                dim=result.dim,
                deployment_id=deployment_id,
                node_id=dispatch.node_id,
                encoding=encoding,
            )

    async def _resolve(self, request: inference_pb2.EmbedRequest) -> str:
        """capability | deployment_id -> a READY deployment, or a typed reason why not."""
        target = request.WhichOneof("target")
        if target == "capability" and (cached := self._routes.get(request.capability)):
            return cached
        async with self._database.transaction() as session:
            if target == "deployment_id":
                deployment_id = parse_id(request.deployment_id, field="deployment_id")
                candidates = [await deployments.get_deployment(session, deployment_id)]
                name = f"deployment {deployment_id}"
            elif target == "capability" and request.capability:
                candidates = list(
                    await deployments.deployments_for_capability(session, request.capability)
                )
                name = f"capability {request.capability!r}"
                if not candidates:
                    raise GantryError(
                        "NOT_FOUND", f"no deployment serves {name}", capability=request.capability
                    )
            else:
                raise invalid_argument("set capability or deployment_id", field="target")
        for deployment in candidates:
            if deployment.state == DeploymentState.READY:
                if target == "capability":
                    self._routes.put(request.capability, deployment.deployment_id)
                return deployment.deployment_id
        states = ", ".join(sorted({d.state for d in candidates}))
        raise GantryError("DEPLOYMENT_NOT_READY", f"{name} has no ready deployment ({states})")

"""`inference.GRPCInferenceService` on the control plane's port: the Open Inference Protocol
(KServe v2 / Triton gRPC) as an adapter over gantry.v1.Inference.

A model is a capability. ModelInfer decodes the tensors, picks the capability's tensor mapping
(mappings.py, from its bound deployment's adapter) and awaits the gantry.v1 handler that mapping
names, in this call's context: the tenant is the key's, the binding, the limits, the scheduler's
admission (QUEUE_FULL, quotas, budgets), the breakers and the metrics are those of the gantry.v1
call, so no protocol is a way around them. Errors are GantryErrors, mapped once by the server
interceptor: the client sees the status code and the ErrorInfo reason a gantry.v1 client sees.
ServerLive, ServerReady and ServerMetadata are open (auth.OPEN_PREFIXES); the rest need a key.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Awaitable
from typing import TypeVar

import grpc
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import GantryError, excerpt, invalid_argument
from gantry.common.telemetry import extract_context, tracer
from gantry.controlplane.deployments import bindings
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.platform import metrics
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.models import CapabilityBinding, Deployment
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.controlplane.platform.state_machines import DeploymentState
from gantry.controlplane.serving.inference_calls import await_reporting
from gantry.controlplane.serving.inference_service import InferenceService
from gantry.controlplane.serving.kserve.mappings import Call, TensorMapping, TensorSpec, mapping_of
from gantry.controlplane.serving.kserve.tensors import add_outputs, decode_inputs
from gantry.controlplane.serving.routing import DeploymentResolver
from gantry.kserve import grpc_service_pb2 as kserve
from gantry.kserve import grpc_service_pb2_grpc
from gantry.v1 import common_pb2, inference_pb2

_tracer = tracer("gantry.controlplane")
_Response = TypeVar("_Response")

SERVER_NAME = "gantry"
PLATFORM = "gantry"
# The request parameters read here (the Triton "parameters" extension).
PRIORITY_PARAMETER = "priority"  # "INTERACTIVE" (default) or "BATCH"
TRUNCATE_PARAMETER = "truncate"  # bool: cut over-long texts to the model's limit
RAW_OUTPUT_PARAMETER = "binary_data_output"  # bool, default true: false puts typed contents
_PRIORITIES = {
    "INTERACTIVE": common_pb2.PRIORITY_INTERACTIVE,
    "BATCH": common_pb2.PRIORITY_BATCH,
}
# Deployments' adapters never change, so the mapping of a deployment is read once; bounded.
_ADAPTER_CACHE_LIMIT = 4096
_BINDING_PAGE = 500


def _server_version() -> str:
    try:
        return importlib.metadata.version("gantry-controlplane")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def _tensor_metadata(
    specs: tuple[TensorSpec, ...],
) -> list[kserve.ModelMetadataResponse.TensorMetadata]:
    return [
        kserve.ModelMetadataResponse.TensorMetadata(
            name=spec.name, datatype=spec.datatype, shape=list(spec.shape)
        )
        for spec in specs
    ]


def _parameter(
    request: kserve.ModelInferRequest, name: str, kind: str
) -> kserve.InferParameter | None:
    if name not in request.parameters:
        return None
    parameter = request.parameters[name]
    if parameter.WhichOneof("parameter_choice") != kind:
        raise invalid_argument(
            f"request parameter {name!r} must be a {kind.removesuffix('_param')}", field=name
        )
    return parameter


def _priority(request: kserve.ModelInferRequest) -> common_pb2.Priority:
    parameter = _parameter(request, PRIORITY_PARAMETER, "string_param")
    if parameter is None:
        return common_pb2.PRIORITY_INTERACTIVE
    priority = _PRIORITIES.get(parameter.string_param.upper())
    if priority is None:
        raise invalid_argument(
            f"request parameter 'priority' must be one of {', '.join(_PRIORITIES)}",
            field=PRIORITY_PARAMETER,
        )
    return priority


def _flag(request: kserve.ModelInferRequest, name: str, *, default: bool) -> bool:
    parameter = _parameter(request, name, "bool_param")
    return default if parameter is None else parameter.bool_param


def _trace_carrier(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The caller's W3C trace context (traceparent, tracestate) from its metadata."""
    carrier: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if key in ("traceparent", "tracestate"):
            carrier[key] = value.decode() if isinstance(value, bytes) else value
    return carrier


class KServeInference(grpc_service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self,
        *,
        database: Database,
        inference: InferenceService,
        resolver: DeploymentResolver,
        scheduler: SchedulerLink,
    ) -> None:
        self._database = database
        self._inference = inference
        self._resolver = resolver
        self._scheduler = scheduler
        self._adapters: dict[str, str] = {}  # deployment id -> adapter name
        self._version = _server_version()

    async def ServerLive(
        self, request: kserve.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> kserve.ServerLiveResponse:
        return kserve.ServerLiveResponse(live=True)

    async def ServerReady(
        self, request: kserve.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> kserve.ServerReadyResponse:
        # Without its scheduler the control plane dispatches nothing: every call would fail.
        return kserve.ServerReadyResponse(ready=self._scheduler.connected)

    async def ServerMetadata(
        self, request: kserve.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> kserve.ServerMetadataResponse:
        return kserve.ServerMetadataResponse(
            name=SERVER_NAME, version=self._version, extensions=["parameters"]
        )

    async def ModelReady(
        self, request: kserve.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> kserve.ModelReadyResponse:
        return await _counted("ModelReady", self._model_ready(request))

    async def ModelMetadata(
        self, request: kserve.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> kserve.ModelMetadataResponse:
        return await _counted("ModelMetadata", self._model_metadata(request))

    async def ModelInfer(
        self, request: kserve.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> kserve.ModelInferResponse:
        with _tracer.start_as_current_span(
            "kserve.ModelInfer",
            context=extract_context(_trace_carrier(context)),
            attributes={"gantry.capability": excerpt(request.model_name)},
        ):
            return await _counted("ModelInfer", self._model_infer(request, context))

    async def RepositoryIndex(
        self, request: kserve.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> kserve.RepositoryIndexResponse:
        return await _counted("RepositoryIndex", self._repository_index(request))

    async def _model_ready(self, request: kserve.ModelReadyRequest) -> kserve.ModelReadyResponse:
        _check_name(request.name)
        async with self._database.transaction() as session:
            binding = await bindings.get_binding(session, request.name)
            if binding is None or binding.deployment_id is None:
                return kserve.ModelReadyResponse(ready=False)
            deployment = await deployments.get_deployment(session, binding.deployment_id)
        # Only READY: a DEGRADED deployment still serves, but Triton's clients read "ready" as
        # "healthy", and the operator's answer (GetDeployment) says why it is not.
        return kserve.ModelReadyResponse(ready=deployment.state == DeploymentState.READY)

    async def _model_metadata(
        self, request: kserve.ModelMetadataRequest
    ) -> kserve.ModelMetadataResponse:
        _check_name(request.name)
        async with self._database.transaction() as session:
            binding = await bindings.get_binding(session, request.name)
            if binding is None:
                raise GantryError(
                    "NOT_FOUND",
                    f"no deployment is bound to capability {excerpt(request.name)!r}",
                    capability=request.name,
                )
            deployment_id = binding.deployment_id or binding.pending_deployment_id or ""
            deployment = await deployments.get_deployment(session, deployment_id)
        mapping = _mapping_for(request.name, deployment.adapter.get("adapter", ""))
        return kserve.ModelMetadataResponse(
            name=request.name,
            versions=[],
            platform=PLATFORM,
            inputs=_tensor_metadata(mapping.inputs),
            outputs=_tensor_metadata(mapping.outputs),
        )

    async def _model_infer(
        self, request: kserve.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> kserve.ModelInferResponse:
        capability = request.model_name
        if not capability:
            raise invalid_argument("model_name (the capability) is required", field="model_name")
        tensors = decode_inputs(request)
        priority = _priority(request)
        truncate = _flag(request, TRUNCATE_PARAMETER, default=False)
        raw = _flag(request, RAW_OUTPUT_PARAMETER, default=True)
        # The binding read here is the route cache's; the handler below resolves it again, from
        # the same cache, and is the one that routes.
        deployment_id = await self._resolver.resolve(
            inference_pb2.EmbedRequest(capability=capability)
        )
        mapping = _mapping_for(capability, await self._adapter_of(deployment_id))
        mapping.check_names(tensors)
        answer = await mapping.infer(
            Call(
                capability=capability,
                tensors=tensors,
                priority=priority,
                truncate=truncate,
                inference=self._inference,
                context=context,
            )
        )
        outputs = answer.outputs
        if request.outputs:
            made = {output.name: output for output in outputs}
            wanted = []
            for requested in request.outputs:
                if requested.name not in made:
                    raise invalid_argument(
                        f"output tensor {requested.name!r} is not one this call makes; it makes "
                        f"{', '.join(made)}",
                        field=requested.name,
                    )
                wanted.append(made[requested.name])
            outputs = wanted
        response = kserve.ModelInferResponse(
            model_name=capability,
            id=request.id,
            parameters={
                "deployment_id": kserve.InferParameter(string_param=answer.deployment_id),
                "node_id": kserve.InferParameter(string_param=answer.node_id),
            },
        )
        add_outputs(response, outputs, raw=raw)
        return response

    async def _adapter_of(self, deployment_id: str) -> str:
        adapter = self._adapters.get(deployment_id)
        if adapter is None:
            async with self._database.transaction() as session:
                deployment = await deployments.get_deployment(session, deployment_id)
            adapter = str(deployment.adapter.get("adapter", ""))
            if len(self._adapters) >= _ADAPTER_CACHE_LIMIT:
                self._adapters.clear()
            self._adapters[deployment_id] = adapter
        return adapter

    async def _repository_index(
        self, request: kserve.RepositoryIndexRequest
    ) -> kserve.RepositoryIndexResponse:
        response = kserve.RepositoryIndexResponse()
        after = ""
        while True:
            async with self._database.transaction() as session:
                page = await bindings.list_bindings(session, after=after, limit=_BINDING_PAGE)
                rows = [(binding, await _bound(session, binding)) for binding in page]
            for binding, deployment in rows:
                state, reason = _index_state(binding, deployment)
                if request.ready and state != "READY":
                    continue
                response.models.add(name=binding.capability, state=state, reason=reason)
            if len(page) < _BINDING_PAGE:
                return response
            after = page[-1].capability


async def _bound(session: AsyncSession, binding: CapabilityBinding) -> Deployment | None:
    if binding.deployment_id is None:
        return None
    return await deployments.get_deployment(session, binding.deployment_id)


def _index_state(binding: CapabilityBinding, deployment: Deployment | None) -> tuple[str, str]:
    if deployment is None:
        return "UNAVAILABLE", f"waiting for deployment {binding.pending_deployment_id} to be READY"
    if deployment.state == DeploymentState.READY:
        return "READY", ""
    return "UNAVAILABLE", f"deployment {deployment.deployment_id} is {deployment.state}"


def _check_name(name: str) -> None:
    if not name:
        raise invalid_argument("name (the capability) is required", field="name")


def _mapping_for(capability: str, adapter: str) -> TensorMapping:
    mapping = mapping_of(adapter)
    if mapping is None:
        raise invalid_argument(
            f"capability {capability!r} is served by adapter {adapter!r}, which has no KServe "
            "tensor mapping",
            capability=capability,
            adapter=adapter,
        )
    return mapping


async def _counted(method: str, answer: Awaitable[_Response]) -> _Response:
    """Await one KServe call's answer and count it as this front door's, whatever it is."""
    return await await_reporting(
        answer, lambda error: metrics.front_door_answered(metrics.PROTOCOL_KSERVE, method, error)
    )

"""`inference.GRPCInferenceService` on the control plane's port: the Open Inference Protocol
(KServe v2 / Triton gRPC) as an adapter over gantry.v1.Inference.

A model is a capability. ModelInfer decodes the tensors, picks the capability's tensor mapping
(mappings.py, from its bound deployment's adapter) and awaits the gantry.v1 handler that mapping
names, in this call's context: the tenant is the key's, the binding, the limits, the scheduler's
admission (QUEUE_FULL, quotas, budgets), the breakers and the metrics are those of the gantry.v1
call, so no protocol is a way around them. Errors are GantryErrors, mapped once by the server
interceptor: the client sees the status code and the ErrorInfo reason a gantry.v1 client sees.
ServerLive, ServerReady and ServerMetadata are open (auth.OPEN_PREFIXES); the rest need a key.
The service's other RPCs (SERVED lists the served ones) answer UNIMPLEMENTED with ErrorInfo.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import grpc
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import GantryError, excerpt, invalid_argument
from gantry.common.telemetry import extract_context, tracer
from gantry.controlplane.deployments import bindings
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.evidence import candidates, probes
from gantry.controlplane.platform import metrics
from gantry.controlplane.platform.call_tally import CapabilityCalls
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.models import CapabilityBinding, Deployment
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.controlplane.platform.state_machines import DeploymentState
from gantry.controlplane.serving.inference_calls import await_reporting
from gantry.controlplane.serving.inference_service import InferenceService
from gantry.controlplane.serving.kserve.mappings import (
    GENERATION,
    Answer,
    Call,
    TensorMapping,
    TensorSpec,
    generation_request,
    mapping_of,
    probed_width,
    stated_outputs,
)
from gantry.controlplane.serving.kserve.streaming import StreamedChunks, stream_error
from gantry.controlplane.serving.kserve.tensors import BYTES, add_outputs, decode_inputs
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
# The RPCs of inference.GRPCInferenceService answered here; every other one of its descriptor
# answers UNIMPLEMENTED (`unserved`), installed on the servicer below.
SERVED = (
    "ServerLive",
    "ServerReady",
    "ServerMetadata",
    "ModelReady",
    "ModelMetadata",
    "ModelConfig",
    "ModelStatistics",
    "ModelInfer",
    "ModelStreamInfer",
    "RepositoryIndex",
)
UNSERVED = tuple(
    method.name
    for method in kserve.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    if method.name not in SERVED
)


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
        return kserve.ServerReadyResponse(ready=self.server_ready())

    async def ServerMetadata(
        self, request: kserve.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> kserve.ServerMetadataResponse:
        return self.server_metadata()

    # The protocol's answers, uncounted: each door (this servicer's RPCs, the REST routes in
    # openai_http/kserve_routes.py) counts and traces its own calls around them.

    def server_ready(self) -> bool:
        # Without its scheduler the control plane dispatches nothing: every call would fail.
        return self._scheduler.connected

    def server_metadata(self) -> kserve.ServerMetadataResponse:
        return kserve.ServerMetadataResponse(
            name=SERVER_NAME, version=self._version, extensions=["parameters"]
        )

    async def ModelReady(
        self, request: kserve.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> kserve.ModelReadyResponse:
        return await _counted("ModelReady", self.model_ready(request))

    async def ModelMetadata(
        self, request: kserve.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> kserve.ModelMetadataResponse:
        return await _counted("ModelMetadata", self.model_metadata(request))

    async def ModelInfer(
        self, request: kserve.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> kserve.ModelInferResponse:
        with _tracer.start_as_current_span(
            "kserve.ModelInfer",
            context=extract_context(_trace_carrier(context)),
            attributes={"gantry.capability": excerpt(request.model_name)},
        ):
            return await _counted("ModelInfer", self.model_infer(request, context))

    async def ModelStreamInfer(
        self,
        request_iterator: AsyncIterator[kserve.ModelInferRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """Triton's decoupled streaming: the requests answered in order as they come, each counted
        and traced as a ModelInfer is. A refused request is answered with its `error_message`
        (the reason first) and the stream goes on, as Triton's does."""
        async for request in request_iterator:
            with _tracer.start_as_current_span(
                "kserve.ModelStreamInfer",
                context=extract_context(_trace_carrier(context)),
                attributes={"gantry.capability": excerpt(request.model_name)},
            ):
                try:
                    await _counted("ModelStreamInfer", self.model_stream_infer(request, context))
                except GantryError as error:
                    await context.write(stream_error(request, error))

    async def RepositoryIndex(
        self, request: kserve.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> kserve.RepositoryIndexResponse:
        return await _counted("RepositoryIndex", self.repository_index(request))

    async def ModelConfig(
        self, request: kserve.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> kserve.ModelConfigResponse:
        return await _counted("ModelConfig", self.model_config(request))

    async def ModelStatistics(
        self, request: kserve.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> kserve.ModelStatisticsResponse:
        return await _counted("ModelStatistics", self.model_statistics(request))

    async def model_statistics(
        self, request: kserve.ModelStatisticsRequest
    ) -> kserve.ModelStatisticsResponse:
        """This replica's tally (metrics.CALLS) of the named capability, or of every bound one."""
        if request.name:
            async with self._database.read() as session:
                if await bindings.get_binding(session, request.name) is None:
                    raise _not_bound(request.name)
            names = [request.name]
        else:
            names = [binding.capability async for binding, _ in self._bindings()]
        return kserve.ModelStatisticsResponse(
            model_stats=[statistics_of(name, metrics.CALLS.of(name)) for name in names]
        )

    async def model_config(self, request: kserve.ModelConfigRequest) -> kserve.ModelConfigResponse:
        metadata = await self.model_metadata(
            kserve.ModelMetadataRequest(name=request.name, version=request.version)
        )
        return kserve.ModelConfigResponse(config=config_of(metadata))

    async def model_ready(self, request: kserve.ModelReadyRequest) -> kserve.ModelReadyResponse:
        _check_name(request.name)
        async with self._database.read() as session:
            binding = await bindings.get_binding(session, request.name)
            if binding is None or binding.deployment_id is None:
                return kserve.ModelReadyResponse(ready=False)
            deployment = await deployments.get_deployment(session, binding.deployment_id)
        # Only READY: a DEGRADED deployment still serves, but Triton's clients read "ready" as
        # "healthy", and the operator's answer (GetDeployment) says why it is not.
        return kserve.ModelReadyResponse(ready=deployment.state == DeploymentState.READY)

    async def model_metadata(
        self, request: kserve.ModelMetadataRequest
    ) -> kserve.ModelMetadataResponse:
        _check_name(request.name)
        async with self._database.read() as session:
            binding = await bindings.get_binding(session, request.name)
            if binding is None:
                raise _not_bound(request.name)
            deployment_id = binding.deployment_id or binding.pending_deployment_id or ""
            deployment = await deployments.get_deployment(session, deployment_id)
            mapping = _mapping_for(request.name, deployment.adapter.get("adapter", ""))
            width = probed_width(mapping.kind, await _probed_shape(session, deployment))
        return kserve.ModelMetadataResponse(
            name=request.name,
            versions=[],
            platform=PLATFORM,
            inputs=_tensor_metadata(mapping.inputs),
            outputs=_tensor_metadata(stated_outputs(mapping, width)),
        )

    async def model_infer(
        self, request: kserve.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> kserve.ModelInferResponse:
        mapping, call = await self._call_of(request, context)
        return infer_response(request, await mapping.infer(call))

    async def model_stream_infer(
        self, request: kserve.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """One request of a ModelStreamInfer stream, its responses written to `context`: a
        generation's as GenerateStream writes its chunks (streaming.py), any other kind's one."""
        mapping, call = await self._call_of(request, context)
        if mapping is not GENERATION:
            response = infer_response(request, await mapping.infer(call))
            await context.write(kserve.ModelStreamInferResponse(infer_response=response))
            return
        chunks = StreamedChunks(
            request, context, raw=_flag(request, RAW_OUTPUT_PARAMETER, default=True)
        )
        await self._inference.GenerateStream(generation_request(call), chunks.as_grpc())

    async def _call_of(
        self, request: kserve.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> tuple[TensorMapping, Call]:
        """The request's tensors decoded and checked against its capability's mapping."""
        capability = request.model_name
        if not capability:
            raise invalid_argument("model_name (the capability) is required", field="model_name")
        tensors = decode_inputs(request)
        priority = _priority(request)
        truncate = _flag(request, TRUNCATE_PARAMETER, default=False)
        _flag(request, RAW_OUTPUT_PARAMETER, default=True)  # checked before any work is done
        # The binding read here is the route cache's; the handler below resolves it again, from
        # the same cache, and is the one that routes.
        deployment_id = await self._resolver.resolve(
            inference_pb2.EmbedRequest(capability=capability)
        )
        mapping = _mapping_for(capability, await self._adapter_of(deployment_id))
        mapping.check_names(tensors)
        call = Call(
            capability=capability,
            tensors=tensors,
            priority=priority,
            truncate=truncate,
            inference=self._inference,
            context=context,
        )
        return mapping, call

    async def _adapter_of(self, deployment_id: str) -> str:
        adapter = self._adapters.get(deployment_id)
        if adapter is None:
            async with self._database.read() as session:
                deployment = await deployments.get_deployment(session, deployment_id)
            adapter = str(deployment.adapter.get("adapter", ""))
            if len(self._adapters) >= _ADAPTER_CACHE_LIMIT:
                self._adapters.clear()
            self._adapters[deployment_id] = adapter
        return adapter

    async def repository_index(
        self, request: kserve.RepositoryIndexRequest
    ) -> kserve.RepositoryIndexResponse:
        response = kserve.RepositoryIndexResponse()
        async for binding, deployment in self._bindings():
            state, reason = _index_state(binding, deployment)
            if request.ready and state != "READY":
                continue
            response.models.add(name=binding.capability, state=state, reason=reason)
        return response

    async def _bindings(self) -> AsyncIterator[tuple[CapabilityBinding, Deployment | None]]:
        """Every binding, by capability, with its bound deployment; read a page at a time."""
        after = ""
        while True:
            async with self._database.read() as session:
                page = await bindings.list_bindings(session, after=after, limit=_BINDING_PAGE)
                rows = [(binding, await _bound(session, binding)) for binding in page]
            for row in rows:
                yield row
            if len(page) < _BINDING_PAGE:
                return
            after = page[-1].capability


def unserved(method: str) -> GantryError:
    """The answer of an RPC (or its REST path) of the protocol that Gantry does not serve."""
    return GantryError(
        "UNIMPLEMENTED",
        f"{method} is not served here; Gantry's Open Inference Protocol serves {', '.join(SERVED)}",
        method=method,
        served=",".join(SERVED),
    )


def _unserved_rpc(method: str) -> object:
    async def answer(
        self: KServeInference, request: kserve.Unserved, context: grpc.aio.ServicerContext
    ) -> kserve.Unserved:
        return await _counted(method, _refused(unserved(method)))

    answer.__name__ = method
    return answer


async def _refused(error: GantryError) -> kserve.Unserved:
    raise error


for _method in UNSERVED:
    setattr(KServeInference, _method, _unserved_rpc(_method))


def _not_bound(capability: str) -> GantryError:
    return GantryError(
        "NOT_FOUND",
        f"no deployment is bound to capability {excerpt(capability)!r}",
        capability=capability,
    )


def _duration(count: int, ns: int) -> kserve.StatisticDuration:
    return kserve.StatisticDuration(count=count, ns=ns)


def statistics_of(capability: str, calls: CapabilityCalls) -> kserve.ModelStatistics:
    """One capability's tally as Triton's ModelStatistics: each call counts once (Triton counts
    a batch's inferences apart), so inference_count and execution_count are both the successes."""
    return kserve.ModelStatistics(
        name=capability,
        last_inference=calls.last_answered_ms,
        inference_count=calls.success_count,
        execution_count=calls.success_count,
        inference_stats=kserve.InferStatistics(
            success=_duration(calls.success_count, calls.success_ns),
            fail=_duration(calls.fail_count, calls.fail_ns),
        ),
    )


async def _bound(session: AsyncSession, binding: CapabilityBinding) -> Deployment | None:
    if binding.deployment_id is None:
        return None
    return await deployments.get_deployment(session, binding.deployment_id)


async def _probed_shape(session: AsyncSession, deployment: Deployment) -> list[object]:
    """The output shape its approved candidate's probe measured (ProbeEvidence.output_shape, as
    stored); [] for a deployment without one (adopted endpoints)."""
    if not deployment.candidate_id:
        return []
    candidate = await candidates.get_candidate(session, deployment.candidate_id)
    probe = await probes.get_probe(session, candidate.probe_id)
    shape = probe.evidence.get("output_shape", [])
    return list(shape) if isinstance(shape, list) else []


def _index_state(binding: CapabilityBinding, deployment: Deployment | None) -> tuple[str, str]:
    if deployment is None:
        return "UNAVAILABLE", f"waiting for deployment {binding.pending_deployment_id} to be READY"
    if deployment.state == DeploymentState.READY:
        return "READY", ""
    return "UNAVAILABLE", f"deployment {deployment.deployment_id} is {deployment.state}"


def _data_type(datatype: str) -> str:
    """A tensor's datatype as Triton's configuration names it (BYTES is TYPE_STRING)."""
    return kserve.DataType.Name(
        kserve.DataType.Value("TYPE_STRING" if datatype == BYTES else f"TYPE_{datatype}")
    )


def config_of(metadata: kserve.ModelMetadataResponse) -> kserve.ModelConfig:
    """Triton's model configuration from the metadata: what Gantry can state truthfully (the
    name, platform and backend "gantry", the tensors with their whole shapes, so
    max_batch_size 0), nothing of a Triton repository's settings."""
    return kserve.ModelConfig(
        name=metadata.name,
        platform=metadata.platform,
        backend=metadata.platform,
        max_batch_size=0,
        input=[
            kserve.ModelInput(name=t.name, data_type=_data_type(t.datatype), dims=t.shape)
            for t in metadata.inputs
        ],
        output=[
            kserve.ModelOutput(name=t.name, data_type=_data_type(t.datatype), dims=t.shape)
            for t in metadata.outputs
        ],
    )


def infer_response(request: kserve.ModelInferRequest, answer: Answer) -> kserve.ModelInferResponse:
    """A mapping's answer as the request asked for it: the outputs it names (all by default), in
    its order, raw or typed (binary_data_output), with where the call ran."""
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
        model_name=request.model_name,
        id=request.id,
        parameters={
            "deployment_id": kserve.InferParameter(string_param=answer.deployment_id),
            "node_id": kserve.InferParameter(string_param=answer.node_id),
        },
    )
    add_outputs(response, outputs, raw=_flag(request, RAW_OUTPUT_PARAMETER, default=True))
    return response


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

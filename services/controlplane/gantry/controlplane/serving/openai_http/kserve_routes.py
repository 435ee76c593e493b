"""The Open Inference Protocol over REST (KServe v2 HTTP/JSON, Triton's binary tensors) on the
HTTP port, beside the OpenAI routes: each route turns its call into the gRPC door's request
(rest.py), awaits the KServe adapter's own answer (service.py) and spells it back in REST.

So a REST call takes the gRPC door's path below the protocol: the tensor mappings, the binding,
the limits, the scheduler's admission. Around it the HTTP door's own (openai_http/routes.py):
the key (the gRPC interceptor's check), the body bound refused before it is buffered, the calls
in flight per tenant, the span, and gantry_front_door_calls{protocol="kserve_v2"}. The health
routes and the server's metadata are open, as the gRPC door's ServerLive, ServerReady and
ServerMetadata are.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gantry.common.errors import GantryError
from gantry.controlplane.serving.kserve import rest
from gantry.controlplane.serving.kserve.service import KServeInference, unserved
from gantry.controlplane.serving.openai_http.errors import http_status
from gantry.controlplane.serving.openai_http.front_door import HttpCallContext, unless_disconnected
from gantry.kserve import grpc_service_pb2 as kserve

_Operation = Callable[[Request], Awaitable[Response]]
# A not-ready answer: the protocol says "a 4xx status indicates false"; Triton answers 400.
NOT_READY_STATUS = 400


@dataclass(frozen=True, slots=True)
class RestRoute:
    path: str
    method: str
    operation: _Operation
    open: bool = False  # served without a key (probes)


def refusal(error: GantryError, status: int | None = None) -> Response:
    refused = rest.rest_error(error, status or http_status(error))
    return JSONResponse(refused.body, status_code=refused.status, headers=refused.headers)


def _unserved(rpc: str) -> _Operation:
    """The route of a path whose RPC is not served: UNIMPLEMENTED, in the door's error shape."""

    async def refuse(request: Request) -> Response:
        raise unserved(rpc)

    return refuse


def _version(request: Request) -> str:
    return str(request.path_params.get("version", ""))


class KServeRest:
    """The REST routes over one KServe adapter; `body` reads a call's body within its bound."""

    def __init__(self, adapter: KServeInference, body: Callable[[Request], Awaitable[bytes]]):
        self._adapter = adapter
        self._body = body

    def routes(self) -> list[RestRoute]:
        model = "/v2/models/{model}"
        versioned = "/v2/models/{model}/versions/{version}"
        return [
            RestRoute("/v2/health/live", "GET", self._live, open=True),
            RestRoute("/v2/health/ready", "GET", self._ready, open=True),
            RestRoute("/v2", "GET", self._server_metadata, open=True),
            RestRoute("/v2/repository/index", "POST", self._repository_index),
            # Before /v2/models/{model}, which would read "stats" as a model's name.
            RestRoute("/v2/models/stats", "GET", self._model_statistics),
            *(RestRoute(path, method, _unserved(rpc)) for method, path, rpc in rest.UNSERVED_PATHS),
            *(
                route
                for prefix in (model, versioned)
                for route in (
                    RestRoute(prefix, "GET", self._model_metadata),
                    RestRoute(f"{prefix}/ready", "GET", self._model_ready),
                    RestRoute(f"{prefix}/config", "GET", self._model_config),
                    RestRoute(f"{prefix}/infer", "POST", self._infer),
                    RestRoute(f"{prefix}/stats", "GET", self._model_statistics),
                )
            ),
        ]

    async def _live(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _ready(self, request: Request) -> Response:
        return Response(status_code=200 if self._adapter.server_ready() else NOT_READY_STATUS)

    async def _server_metadata(self, request: Request) -> Response:
        return JSONResponse(rest.server_metadata(self._adapter.server_metadata()))

    async def _repository_index(self, request: Request) -> Response:
        body = await self._body(request)
        ready = rest.index_ready_only(body)
        answer = await self._adapter.repository_index(kserve.RepositoryIndexRequest(ready=ready))
        return JSONResponse(rest.repository_index(answer))

    async def _metadata(self, request: Request) -> kserve.ModelMetadataResponse:
        return await self._adapter.model_metadata(
            kserve.ModelMetadataRequest(
                name=request.path_params["model"], version=_version(request)
            )
        )

    async def _model_metadata(self, request: Request) -> Response:
        return JSONResponse(rest.model_metadata(await self._metadata(request)))

    async def _model_config(self, request: Request) -> Response:
        answer = await self._adapter.model_config(
            kserve.ModelConfigRequest(name=request.path_params["model"], version=_version(request))
        )
        return JSONResponse(rest.model_config(answer))

    async def _model_statistics(self, request: Request) -> Response:
        answer = await self._adapter.model_statistics(
            kserve.ModelStatisticsRequest(
                name=request.path_params.get("model", ""), version=_version(request)
            )
        )
        return JSONResponse(rest.model_statistics(answer))

    async def _model_ready(self, request: Request) -> Response:
        answer = await self._adapter.model_ready(
            kserve.ModelReadyRequest(name=request.path_params["model"], version=_version(request))
        )
        return Response(status_code=200 if answer.ready else NOT_READY_STATUS)

    async def _infer(self, request: Request) -> Response:
        encoding = request.headers.get("content-encoding", "identity")
        if encoding != "identity":
            raise GantryError(
                "INVALID_ARGUMENT",
                f"a request body in Content-Encoding {encoding!r} is not read here: send it as is",
                field="content-encoding",
            )
        call = rest.infer_request(
            request.path_params["model"],
            _version(request),
            await self._body(request),
            request.headers.get(rest.HEADER_LENGTH),
        )
        answer = await unless_disconnected(
            request.receive, self._adapter.model_infer(call.request, HttpCallContext().as_grpc())
        )
        spelled = rest.infer_response(answer, call.binary_outputs)
        headers = (
            {}
            if spelled.header_length is None
            else {"Inference-Header-Content-Length": str(spelled.header_length)}
        )
        return Response(spelled.body, media_type=spelled.content_type, headers=headers)

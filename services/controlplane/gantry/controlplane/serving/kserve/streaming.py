"""ModelStreamInfer's responses (Triton's decoupled streaming): a generation's chunks, as
gantry.v1 GenerateStream's handler writes them, each written on as one ModelStreamInferResponse,
and a refused request's error. The handler runs unchanged: it is given a context whose `write`
turns its GenerateChunk into the protocol's response and writes that to the stream, so its
backpressure, cancellation and CLIENT_TOO_SLOW bound are the gRPC stream's own.

Each chunk is a response with `text_output` (the text since the previous one); the last one
(it carries where the call ran) adds `finish_reason` and the parameter `triton_final_response`
true, which Triton's clients read as the end of a decoupled request's responses.
"""

from __future__ import annotations

from typing import Any, cast

import grpc

from gantry.common.errors import GantryError
from gantry.controlplane.serving.kserve.mappings import generation_outputs
from gantry.controlplane.serving.kserve.tensors import add_outputs
from gantry.kserve import grpc_service_pb2 as kserve
from gantry.v1 import inference_pb2

FINAL_PARAMETER = "triton_final_response"


def chunk_response(
    request: kserve.ModelInferRequest, chunk: inference_pb2.GenerateChunk, *, raw: bool
) -> kserve.ModelStreamInferResponse:
    """One GenerateChunk as the stream's response to `request`."""
    final = bool(chunk.deployment_id)  # set on the last chunk only
    parameters = {FINAL_PARAMETER: kserve.InferParameter(bool_param=final)}
    if final:
        parameters["deployment_id"] = kserve.InferParameter(string_param=chunk.deployment_id)
        parameters["node_id"] = kserve.InferParameter(string_param=chunk.node_id)
    response = kserve.ModelInferResponse(
        model_name=request.model_name, id=request.id, parameters=parameters
    )
    add_outputs(
        response, generation_outputs(chunk.text, chunk.finish_reason if final else None), raw=raw
    )
    return kserve.ModelStreamInferResponse(infer_response=response)


def stream_error(
    request: kserve.ModelInferRequest, error: GantryError
) -> kserve.ModelStreamInferResponse:
    """A refused request's answer on the stream: its reason first, as ErrorInfo would carry it
    (a stream's status would end the whole stream)."""
    return kserve.ModelStreamInferResponse(
        error_message=f"{error.reason}: {error.message}",
        infer_response=kserve.ModelInferResponse(model_name=request.model_name, id=request.id),
    )


class StreamedChunks:
    """What GenerateStream's handler asks of its context (time left, `write`), over one request
    of a ModelStreamInfer stream."""

    def __init__(
        self, request: kserve.ModelInferRequest, context: grpc.aio.ServicerContext, *, raw: bool
    ) -> None:
        self._request = request
        self._context = context
        self._raw = raw

    def time_remaining(self) -> float | None:
        return self._context.time_remaining()

    async def write(self, chunk: Any) -> None:
        await self._context.write(chunk_response(self._request, chunk, raw=self._raw))

    def as_grpc(self) -> grpc.aio.ServicerContext:
        # Duck-typed: the handler calls only the two methods above.
        return cast(grpc.aio.ServicerContext, self)

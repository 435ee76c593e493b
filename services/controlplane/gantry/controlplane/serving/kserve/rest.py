"""The Open Inference Protocol's REST spelling (KServe v2 HTTP/JSON, with Triton's binary-tensor
extension) <-> the gRPC messages the KServe adapter answers. Pure: no server, no database.

A REST call is turned into the gRPC door's own request message (`ModelInferRequest`, ...) and its
answer read back from the gRPC response, so one adapter (service.py) and one set of tensor
mappings (mappings.py, tensors.py) answer both doors. Every REST input becomes a raw entry
(`raw_input_contents`): a JSON tensor's `data` is encoded, a binary one's bytes are sliced from
the body's tail, so the tensors are decoded, counted and checked once, by tensors.decode_inputs.

The binary-tensor extension: a body whose JSON part is followed by tensors' bytes says how long
its JSON part is in the `Inference-Header-Content-Length` header, and each such input says how
many of the following bytes are its own in `parameters.binary_data_size`, in input order. An
output is sent the same way when the request asks (`parameters.binary_data_output` for all, or
an output's `parameters.binary_data`); else its elements are JSON `data`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gantry.common.errors import GantryError, invalid_argument
from gantry.controlplane.serving.kserve.tensors import BYTES, decode_raw, encode_raw
from gantry.kserve import grpc_service_pb2 as kserve

HEADER_LENGTH = "inference-header-content-length"
BINARY_SIZE = "binary_data_size"
BINARY_OUTPUT = "binary_data_output"  # request parameter: every output binary
BINARY_DATA = "binary_data"  # an output's parameter: this output binary
# The headers an error answer carries beside its body: Gantry's reason, as ErrorInfo carries it.
REASON_HEADER = "x-gantry-reason"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
# Triton's REST paths for the RPCs Gantry does not serve (service.UNSERVED): (method, path, RPC).
# Each answers UNIMPLEMENTED (HTTP 501) in the error body, as its RPC does over gRPC.
_SHARED_MEMORY = (
    ("SystemSharedMemory", "/v2/systemsharedmemory"),
    ("CudaSharedMemory", "/v2/cudasharedmemory"),
)
UNSERVED_PATHS: tuple[tuple[str, str, str], ...] = (
    ("POST", "/v2/repository/models/{model}/load", "RepositoryModelLoad"),
    ("POST", "/v2/repository/models/{model}/unload", "RepositoryModelUnload"),
    *(
        entry
        for rpc, root in _SHARED_MEMORY
        for entry in (
            ("GET", f"{root}/status", f"{rpc}Status"),
            ("GET", f"{root}/region/{{region}}/status", f"{rpc}Status"),
            ("POST", f"{root}/region/{{region}}/register", f"{rpc}Register"),
            ("POST", f"{root}/unregister", f"{rpc}Unregister"),
            ("POST", f"{root}/region/{{region}}/unregister", f"{rpc}Unregister"),
        )
    ),
    *(
        (method, path, "TraceSetting")
        for path in ("/v2/trace/setting", "/v2/models/{model}/trace/setting")
        for method in ("GET", "POST")
    ),
    ("GET", "/v2/logging", "LogSettings"),
    ("POST", "/v2/logging", "LogSettings"),
)


@dataclass(frozen=True, slots=True)
class RestInfer:
    """A REST infer call as the gRPC adapter takes it, and which outputs go back binary."""

    request: kserve.ModelInferRequest
    binary_outputs: frozenset[str]  # names; "*" for every output
    request_id: str


@dataclass(frozen=True, slots=True)
class RestAnswer:
    body: bytes
    content_type: str
    header_length: int | None  # set when binary outputs follow the JSON part


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid_argument(f"{where} must be a JSON object", field=where)
    return value


def _json_part(body: bytes, header_length: str | None) -> tuple[dict[str, Any], bytes]:
    """The body's JSON object and the binary bytes after it."""
    if header_length is None:
        split = len(body)
    elif header_length.isdigit() and int(header_length) <= len(body):
        split = int(header_length)
    else:
        raise invalid_argument(
            f"the Inference-Header-Content-Length header ({header_length!r}) is not a length "
            f"within the {len(body)}-byte body",
            field=HEADER_LENGTH,
        )
    try:
        document = json.loads(body[:split])
    except (UnicodeDecodeError, ValueError) as exc:
        raise invalid_argument(f"the request's JSON does not parse: {exc}", field="body") from None
    return _object(document, "body"), body[split:]


def _parameters(value: object, where: str) -> dict[str, kserve.InferParameter]:
    """JSON parameters as InferParameters: a bool, an integer or a string each."""
    parameters: dict[str, kserve.InferParameter] = {}
    for key, item in _object(value or {}, where).items():
        if isinstance(item, bool):
            parameters[key] = kserve.InferParameter(bool_param=item)
        elif isinstance(item, int):
            parameters[key] = kserve.InferParameter(int64_param=item)
        elif isinstance(item, str):
            parameters[key] = kserve.InferParameter(string_param=item)
        elif isinstance(item, float):
            parameters[key] = kserve.InferParameter(double_param=item)
        else:
            raise invalid_argument(
                f"{where}.{key} must be a bool, a number or a string", field=f"{where}.{key}"
            )
    return parameters


def _flat(data: object) -> list[object]:
    """A tensor's `data`, nested or flat, as its row-major elements."""
    if not isinstance(data, list):
        return [data]
    flat: list[object] = []
    for item in data:
        flat.extend(_flat(item))
    return flat


def _shape(tensor: Mapping[str, Any], name: str) -> list[int]:
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(dim, int) and not isinstance(dim, bool) for dim in shape
    ):
        raise invalid_argument(
            f"input tensor {name!r} needs a shape: a list of integers", field=name
        )
    return shape


def _input(
    tensor: Mapping[str, Any], tail: bytes, offset: int
) -> tuple[kserve.ModelInferRequest.InferInputTensor, bytes, int]:
    """One JSON input as the gRPC tensor, its raw contents, and where the next binary one starts."""
    name = tensor.get("name")
    datatype = tensor.get("datatype")
    if not isinstance(name, str) or not name:
        raise invalid_argument("every input tensor needs a name", field="inputs")
    if not isinstance(datatype, str):
        raise invalid_argument(f"input tensor {name!r} needs a datatype", field=name)
    shape = _shape(tensor, name)
    parameters = _parameters(tensor.get("parameters"), f"inputs[{name}].parameters")
    size = parameters.pop(BINARY_SIZE, None)
    if size is not None:
        length = size.int64_param
        if size.WhichOneof("parameter_choice") != "int64_param" or length < 0:
            raise invalid_argument(
                f"input tensor {name!r}: binary_data_size must be a byte count", field=name
            )
        if offset + length > len(tail):
            raise invalid_argument(
                f"input tensor {name!r} says {length} binary bytes; the body has "
                f"{len(tail) - offset} left",
                field=name,
            )
        raw = tail[offset : offset + length]
        offset += length
    elif "data" in tensor:
        raw = encode_raw(name, datatype, _flat(tensor["data"]))
    else:
        raise invalid_argument(
            f"input tensor {name!r} has neither data nor binary_data_size", field=name
        )
    grpc_tensor = kserve.ModelInferRequest.InferInputTensor(
        name=name, datatype=datatype, shape=shape, parameters=parameters
    )
    return grpc_tensor, raw, offset


def infer_request(model: str, version: str, body: bytes, header_length: str | None) -> RestInfer:
    """A REST infer body (JSON, or JSON then binary tensors) as the gRPC door's request."""
    document, tail = _json_part(body, header_length)
    inputs = document.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise invalid_argument("inputs must be a non-empty list of tensors", field="inputs")
    request_id = document.get("id", "")
    if not isinstance(request_id, str):
        raise invalid_argument("id must be a string", field="id")
    parameters = _parameters(document.get("parameters"), "parameters")
    binary = set()
    all_binary = parameters.pop(BINARY_OUTPUT, None)
    if all_binary is not None and all_binary.bool_param:
        binary.add("*")
    # The gRPC door's raw outputs are read back here, whatever the REST caller asked for.
    parameters[BINARY_OUTPUT] = kserve.InferParameter(bool_param=True)
    request = kserve.ModelInferRequest(
        model_name=model, model_version=version, id=request_id, parameters=parameters
    )
    offset = 0
    for tensor in inputs:
        grpc_tensor, raw, offset = _input(_object(tensor, "inputs[]"), tail, offset)
        request.inputs.append(grpc_tensor)
        request.raw_input_contents.append(raw)
    if offset != len(tail):
        raise invalid_argument(
            f"the body has {len(tail) - offset} binary bytes that no input tensor claims",
            field="body",
        )
    for output in document.get("outputs") or []:
        output = _object(output, "outputs[]")
        name = output.get("name")
        if not isinstance(name, str):
            raise invalid_argument("every requested output needs a name", field="outputs")
        wanted = _parameters(output.get("parameters"), f"outputs[{name}].parameters")
        if BINARY_DATA in wanted and wanted[BINARY_DATA].bool_param:
            binary.add(name)
        request.outputs.add(name=name)
    return RestInfer(request=request, binary_outputs=frozenset(binary), request_id=request_id)


def _parameter_value(parameter: kserve.InferParameter) -> object:
    return getattr(parameter, parameter.WhichOneof("parameter_choice") or "string_param")


def _json_elements(datatype: str, name: str, raw: bytes, count: int) -> list[object]:
    values = decode_raw(name, datatype, raw, count)
    if datatype == BYTES:
        return [value.decode("utf-8", "replace") for value in values if isinstance(value, bytes)]
    return list(values)


def infer_response(answer: kserve.ModelInferResponse, binary_outputs: frozenset[str]) -> RestAnswer:
    """The gRPC door's answer (raw outputs) as the REST body: JSON data, or binary after it."""
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for tensor, raw in zip(answer.outputs, answer.raw_output_contents, strict=True):
        output: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        if "*" in binary_outputs or tensor.name in binary_outputs:
            output["parameters"] = {BINARY_SIZE: len(raw)}
            blobs.append(raw)
        else:
            count = math.prod(tensor.shape)
            output["data"] = _json_elements(tensor.datatype, tensor.name, raw, count)
        outputs.append(output)
    document: dict[str, Any] = {"model_name": answer.model_name, "outputs": outputs}
    if answer.model_version:
        document["model_version"] = answer.model_version
    if answer.id:
        document["id"] = answer.id
    if answer.parameters:
        document["parameters"] = {
            key: _parameter_value(value) for key, value in answer.parameters.items()
        }
    head = json.dumps(document, separators=(",", ":")).encode()
    if not blobs:
        return RestAnswer(body=head, content_type=JSON_TYPE, header_length=None)
    return RestAnswer(
        body=head + b"".join(blobs), content_type=BINARY_TYPE, header_length=len(head)
    )


def _tensor_metadata(
    tensors: Sequence[kserve.ModelMetadataResponse.TensorMetadata],
) -> list[dict[str, Any]]:
    return [
        {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        for tensor in tensors
    ]


def model_metadata(answer: kserve.ModelMetadataResponse) -> dict[str, Any]:
    return {
        "name": answer.name,
        "versions": list(answer.versions),
        "platform": answer.platform,
        "inputs": _tensor_metadata(answer.inputs),
        "outputs": _tensor_metadata(answer.outputs),
    }


def server_metadata(answer: kserve.ServerMetadataResponse) -> dict[str, Any]:
    return {"name": answer.name, "version": answer.version, "extensions": list(answer.extensions)}


def repository_index(answer: kserve.RepositoryIndexResponse) -> list[dict[str, Any]]:
    return [
        {"name": model.name, "state": model.state, "reason": model.reason}
        for model in answer.models
    ]


def model_config(answer: kserve.ModelConfigResponse) -> dict[str, Any]:
    """Triton's model configuration as its REST route spells it (`data_type` by name)."""
    config = answer.config

    def tensors(
        specs: Sequence[kserve.ModelInput] | Sequence[kserve.ModelOutput],
    ) -> list[dict[str, Any]]:
        return [
            {
                "name": spec.name,
                "data_type": kserve.DataType.Name(spec.data_type),
                "dims": list(spec.dims),
            }
            for spec in specs
        ]

    return {
        "name": config.name,
        "platform": config.platform,
        "backend": config.backend,
        "max_batch_size": config.max_batch_size,
        "input": tensors(config.input),
        "output": tensors(config.output),
    }


def _duration(duration: kserve.StatisticDuration) -> dict[str, int]:
    return {"count": duration.count, "ns": duration.ns}


def model_statistics(answer: kserve.ModelStatisticsResponse) -> dict[str, Any]:
    """Triton's statistics as its REST route spells them (numbers as JSON numbers)."""
    return {
        "model_stats": [
            {
                "name": stats.name,
                "version": stats.version,
                "last_inference": stats.last_inference,
                "inference_count": stats.inference_count,
                "execution_count": stats.execution_count,
                "inference_stats": {
                    "success": _duration(stats.inference_stats.success),
                    "fail": _duration(stats.inference_stats.fail),
                },
            }
            for stats in answer.model_stats
        ]
    }


@dataclass(frozen=True, slots=True)
class RestError:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


def rest_error(error: GantryError, status: int) -> RestError:
    """A typed failure as KServe's REST error: `{"error": message}` (what tritonclient.http
    reads), with Gantry's reason beside it as the OpenAI door gives it (`code`), the request
    field it names (`param`), and the reason in a header. The status is the HTTP doors' one
    table's (openai_http/errors.py), given by the caller. An UNIMPLEMENTED answer lists the
    RPCs that are served (`served`), as its ErrorInfo does."""
    body: dict[str, Any] = {
        "error": error.message,
        "code": error.reason,
        "param": error.metadata.get("field") or None,
    }
    if "served" in error.metadata:
        body["served"] = error.metadata["served"].split(",")
    return RestError(status=status, body=body, headers={REASON_HEADER: error.reason})


def index_ready_only(body: bytes) -> bool:
    """A repository index request's `ready` (its body may be empty: every model)."""
    if not body.strip():
        return False
    document, _ = _json_part(body, None)
    ready = document.get("ready", False)
    if not isinstance(ready, bool):
        raise invalid_argument("ready must be a bool", field="ready")
    return ready

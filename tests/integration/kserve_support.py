"""One KServe v2 infer of BYTES tensors over either door of a running Gantry, its outputs read back
as NumPy arrays (FP32) or lists of bytes (BYTES): over gRPC (ModelInfer with raw contents) and
over REST (the binary-tensor extension both ways), as Triton's clients send them."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence

import httpx
import numpy as np

from gantry.kserve import grpc_service_pb2 as kserve
from gantry.kserve import grpc_service_pb2_grpc as kserve_grpc
from tests.integration.harness import Harness

Output = np.ndarray | list[bytes]


def bytes_tensor(values: Sequence[bytes]) -> bytes:
    """BYTES elements as the protocol's raw contents: each a 4-byte little-endian length, then
    its bytes."""
    return b"".join(struct.pack("<I", len(value)) + value for value in values)


def _elements(raw: bytes) -> list[bytes]:
    values, offset = [], 0
    while offset < len(raw):
        (length,) = struct.unpack_from("<I", raw, offset)
        values.append(raw[offset + 4 : offset + 4 + length])
        offset += 4 + length
    return values


def _output(datatype: str, shape: Sequence[int], raw: bytes) -> Output:
    if datatype == "BYTES":
        values = _elements(raw)
        assert len(values) == math.prod(shape)
        return values
    assert datatype == "FP32", datatype
    return np.frombuffer(raw, dtype="<f4").reshape(tuple(shape))


async def infer_grpc(
    harness: Harness, model: str, inputs: Mapping[str, Sequence[bytes]]
) -> dict[str, Output]:
    request = kserve.ModelInferRequest(model_name=model)
    for name, values in inputs.items():
        request.inputs.add(name=name, datatype="BYTES", shape=[len(values)])
        request.raw_input_contents.append(bytes_tensor(values))
    stub = kserve_grpc.GRPCInferenceServiceStub(harness.channel)
    response = await stub.ModelInfer(request, metadata=harness.client_md)
    return {
        tensor.name: _output(tensor.datatype, tensor.shape, raw)
        for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    }


async def infer_rest(
    harness: Harness, model: str, inputs: Mapping[str, Sequence[bytes]]
) -> dict[str, Output]:
    assert harness.control_plane.http_api is not None, "the harness needs http_listen"
    tails = {name: bytes_tensor(values) for name, values in inputs.items()}
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": "BYTES",
                    "shape": [len(values)],
                    "parameters": {"binary_data_size": len(tails[name])},
                }
                for name, values in inputs.items()
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    address = f"http://127.0.0.1:{harness.control_plane.http_api.port}"
    async with httpx.AsyncClient(base_url=address) as http:
        answer = await http.post(
            f"/v2/models/{model}/infer",
            headers={
                "authorization": f"Bearer {harness.api_key}",
                "inference-header-content-length": str(len(head)),
                "content-type": "application/octet-stream",
            },
            content=head + b"".join(tails.values()),
        )
    assert answer.status_code == 200, answer.text
    split = int(answer.headers["inference-header-content-length"])
    outputs, offset = {}, split
    for output in json.loads(answer.content[:split])["outputs"]:
        size = output["parameters"]["binary_data_size"]
        raw = answer.content[offset : offset + size]
        offset += size
        outputs[output["name"]] = _output(output["datatype"], output["shape"], raw)
    assert offset == len(answer.content)
    return outputs

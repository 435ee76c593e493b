"""`gantry embed`: one Inference.Embed call with the local client key."""

from __future__ import annotations

import argparse
import array
import json
import sys

from gantry.cli.connection import CommandContext
from gantry.v1 import inference_pb2, inference_pb2_grpc

# The first call may wait for a model host to come back; allow more than an operator call.
EMBED_TIMEOUT_S = 120.0
_SHOWN_VALUES = 8


def vector_values(vector: inference_pb2.Vector, encoding: int) -> list[float]:
    if encoding == inference_pb2.VECTOR_ENCODING_FLOAT32_LE_BYTES:
        values = array.array("f")
        values.frombytes(vector.float32_le)
        if sys.byteorder == "big":
            values.byteswap()
        return values.tolist()
    return list(vector.values)


def _float32(value: float) -> float:
    # Nine significant digits round-trip a float32 exactly, without float64 noise digits.
    return float(f"{value:.9g}")


def _preview(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def embed(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.client_metadata()
    request = inference_pb2.EmbedRequest(inputs=args.texts)
    if args.deployment_id:
        request.deployment_id = args.deployment_id
    else:
        request.capability = args.capability
    with context.open_channel() as channel:
        response = inference_pb2_grpc.InferenceStub(channel).Embed(
            request, metadata=metadata, timeout=EMBED_TIMEOUT_S
        )
    vectors = [vector_values(vector, response.encoding) for vector in response.vectors]
    dim = response.dim or (len(vectors[0]) if vectors else 0)
    if args.json:
        document = {
            "deployment_id": response.deployment_id,
            "node_id": response.node_id,
            "dim": dim,
            "vectors": [[_float32(value) for value in vector] for vector in vectors],
        }
        print(json.dumps(document))
        return 0
    print(f"{len(vectors)} vector(s), dim {dim}, deployment {response.deployment_id}")
    for index, (text, vector) in enumerate(zip(args.texts, vectors, strict=False)):
        head = ", ".join(f"{value:+.4f}" for value in vector[:_SHOWN_VALUES])
        more = ", …" if len(vector) > _SHOWN_VALUES else ""
        print(f"[{index}] {_preview(text)!r}: [{head}{more}]")
    return 0

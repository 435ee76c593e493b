"""The text operations' answers: a worker's embeddings and rerank scores checked and shaped into
the client's response. A result that disagrees with the request is INVOKE_FAILED (class INFRA),
counted against the residency that gave it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from gantry.common.errors import GantryError
from gantry.controlplane.serving.vector_wire import vectors_wire
from gantry.v1 import inference_pb2
from gantry.v1 import worker_gateway_pb2 as wg


def embedding_response(
    result: wg.EmbedResult, encoding: inference_pb2.VectorEncoding, *, inputs: int
) -> inference_pb2.EmbedResponse:
    """The vectors of `result` as the client's response (its deployment and node left unset):
    one per input, else INVOKE_FAILED; a block whose size disagrees with count x dim is
    INVOKE_FAILED too (vector_wire)."""
    if result.count != inputs:
        raise GantryError(
            "INVOKE_FAILED", f"the worker returned {result.count} vectors for {inputs} inputs"
        )
    encoding = encoding or inference_pb2.VECTOR_ENCODING_FLOAT_LIST
    response = inference_pb2.EmbedResponse(dim=result.dim, encoding=encoding)
    response.MergeFromString(vectors_wire(result, encoding))
    return response


def ranked(
    scores: Sequence[float], top_n: int, *, documents: int
) -> list[inference_pb2.RankedDocument]:
    """Documents by score, highest first, ties by lower index; the first `top_n` (0 = all).
    One finite score per document, else INVOKE_FAILED (an extra score would name a document
    the request does not hold)."""
    if len(scores) != documents:
        raise GantryError(
            "INVOKE_FAILED", f"the worker returned {len(scores)} scores for {documents} documents"
        )
    if any(not math.isfinite(score) for score in scores):
        raise GantryError("INVOKE_FAILED", "the worker returned a non-finite rerank score")
    order = sorted(range(len(scores)), key=lambda index: (-scores[index], index))
    if top_n:
        order = order[:top_n]
    return [inference_pb2.RankedDocument(index=index, score=scores[index]) for index in order]

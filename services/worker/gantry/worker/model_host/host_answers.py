"""Checking a model host's answer before the worker trusts it (pure).

The host is a sandboxed child running third-party model code: its answer is input like any other,
so an embed answer whose shape or byte count disagrees with the request is refused, never sent on.
"""

from __future__ import annotations

from gantry.common.errors import GantryError
from gantry.v1 import model_host_pb2, worker_gateway_pb2


def checked_embed(
    response: model_host_pb2.HostResponse, *, input_count: int, dim: int
) -> worker_gateway_pb2.EmbedResult:
    """The embed result, when it has one row of the loaded width per input; its failure raised."""
    kind = response.WhichOneof("kind")
    if kind == "failure":
        raise GantryError.from_failure(response.failure)
    if kind != "embed":
        raise GantryError("INVOKE_FAILED", f"model host answered an embed with {kind!r}")
    result = response.embed
    if (
        result.count != input_count
        or result.dim != dim
        or len(result.float32_le) != result.count * result.dim * 4
    ):
        raise GantryError(
            "INVOKE_FAILED",
            f"model host answered {result.count}x{result.dim} with {len(result.float32_le)} "
            f"bytes for {input_count} inputs of width {dim}",
        )
    return result

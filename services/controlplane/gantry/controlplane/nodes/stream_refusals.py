"""How a worker stream answers what it will not take from a worker: a Reject on the stream
(counted), or the error that ends the stream. The gateway (gateway.py) decides when."""

from __future__ import annotations

from gantry.common.errors import GantryError
from gantry.controlplane.nodes.sessions import WorkerStream
from gantry.controlplane.platform import metrics
from gantry.v1 import worker_gateway_pb2 as wg


def refuse_stamp(stream: WorkerStream, message: wg.WorkerMessage) -> None:
    """A message stamped with another generation than its stream's: counted and rejected."""
    metrics.message_refused("STALE_GENERATION", message.WhichOneof("kind") or "")
    error = GantryError(
        "STALE_GENERATION",
        f"message from generation {message.generation}, stream holds {stream.generation}",
    )
    stream.send(reject("", error))


def unexpected_kind(kind: str | None) -> GantryError:
    """A message after Hello whose kind this stream does not take: none set (empty, or only a
    field this version does not know), one only a stream's first message may be, or a batch
    inside a batch."""
    said = "no known kind (empty, or a field this control plane does not know)"
    return GantryError(
        "INVALID_ARGUMENT",
        f"a worker message with {said if kind is None else f'kind {kind!r}'} after Hello",
        field="WorkerMessage.kind",
    )


def reject(job_id: str, error: GantryError) -> wg.ControlMessage:
    return wg.ControlMessage(reject=wg.Reject(job_id=job_id, failure=error.to_failure()))

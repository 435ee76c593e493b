"""Size bounds of the worker protocol, checked once when a message arrives on a worker stream.

A node credential is enough to send anything the protocol can carry: an 8 MB progress string, a
1 MB job id, a heartbeat naming 40,000 jobs (issue 26, item 5). Every field of every message a
worker sends is bounded here, in one table (`FIELD_BOUNDS`, keyed by the field's full protobuf
name) with one default for the fields it does not name, and `check_worker_message` walks a
message against it before the gateway logs, stores or keeps anything of it. Pure: no IO.

Strings are bounded in characters, bytes fields in bytes, repeated and map fields in entries (and
each entry by `size` when it is a string). The bounds are far above what a real worker sends
(a UUID job id is 36 characters, a model host's failure carries at most its 50-line stderr tail)
and the results' bounds follow the inference limits' ceilings (`worker_receive_limit_bytes`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from gantry.common.errors import GantryError
from gantry.common.inference_limits import (
    MAX_IMAGES_CEILING,
    MAX_INPUTS_CEILING,
    MAX_TOKENS_CEILING,
    REQUEST_ENVELOPE_BYTES,
    InferenceLimits,
)

# The widest embedding a worker may return (vectors per call x this x 4 bytes bounds a result).
MAX_EMBED_DIM = 8192
# Characters per generated token, generously: bounds a generation's text by its token ceiling.
CHARS_PER_TOKEN = 32
# Text of a transcript: the longest clip allowed (4 h) at 100 characters a second (speech: ~20).
TRANSCRIPT_CHARS = 4 * 60 * 60 * 100
# An identifier the control plane minted (UUIDs) or a token it issued, with room to spare.
ID_CHARS = 64
TOKEN_CHARS = 512
# A failure's message: a model host's stderr tail is 50 lines.
FAILURE_CHARS = 64 * 1024


@dataclass(frozen=True, slots=True)
class Bound:
    """`size`: characters of a string, bytes of a bytes field, or of each string entry of a
    repeated/map field. `items`: entries of a repeated or map field."""

    size: int = 16 * 1024
    items: int = 4096


DEFAULT_BOUND = Bound()

_P = "gantry.v1."
# The one table: every field bounded apart from the default. Keyed by the field's full name.
FIELD_BOUNDS: Mapping[str, Bound] = {
    # The envelope.
    _P + "WorkerMessage.node_id": Bound(size=ID_CHARS),
    _P + "WorkerMessage.trace_context": Bound(size=512, items=16),
    # Jobs: ids and lease tokens the control plane minted, progress a line of text.
    _P + "JobUpdate.job_id": Bound(size=ID_CHARS),
    _P + "JobUpdate.lease_token": Bound(size=TOKEN_CHARS),
    _P + "JobUpdate.progress": Bound(size=4096),
    _P + "JobResult.job_id": Bound(size=ID_CHARS),
    _P + "JobResult.lease_token": Bound(size=TOKEN_CHARS),
    _P + "Heartbeat.active_job_ids": Bound(size=ID_CHARS, items=4096),
    # GPUs: a node has a few; a worker lists at most 256 processes a GPU (gpu_usage.py).
    _P + "Heartbeat.gpus": Bound(items=64),
    _P + "Heartbeat.gpus_unavailable": Bound(size=4096),
    _P + "GpuUsage.processes": Bound(items=256),
    _P + "GpuUsage.processes_unavailable": Bound(size=4096),
    _P + "Failure.reason": Bound(size=128),
    _P + "Failure.message": Bound(size=FAILURE_CHARS),
    _P + "Failure.metadata": Bound(size=4096, items=64),
    # Inventory and the Hello.
    _P + "Inventory.residents": Bound(items=1024),
    _P + "Hello.environments": Bound(items=64),
    _P + "Hello.resource_domains": Bound(items=256),
    _P + "Hello.hostname": Bound(size=255),
    # Its GPUs, as NVML names them.
    _P + "Hello.gpus": Bound(items=64),
    _P + "GpuDevice.name": Bound(size=256),
    _P + "GpuDevice.compute_capability": Bound(size=16),
    _P + "RuntimeEnvironment.versions": Bound(size=256, items=1024),
    _P + "RuntimeEnvironment.adapters": Bound(size=128, items=256),
    _P + "ResidentModel.deployment_id": Bound(size=ID_CHARS),
    _P + "LoadEvidence.runtime_versions": Bound(size=256, items=1024),
    _P + "ProbeEvidence.runtime_versions": Bound(size=256, items=1024),
    _P + "Inspection.findings": Bound(items=1024),
    _P + "Inspection.details": Bound(size=4096, items=1024),
    # Invocation results: as large as the inference limits' ceilings let a call be.
    _P + "InvokeResult.request_id": Bound(size=ID_CHARS),
    _P + "InvokeProgress.request_id": Bound(size=ID_CHARS),
    _P + "EmbedResult.float32_le": Bound(size=MAX_INPUTS_CEILING * MAX_EMBED_DIM * 4),
    _P + "RerankResult.scores": Bound(items=MAX_INPUTS_CEILING),
    _P + "RecognizeTextResult.texts": Bound(size=64 * 1024, items=MAX_IMAGES_CEILING),
    _P + "ClassifyImageResult.scores": Bound(items=MAX_IMAGES_CEILING * MAX_INPUTS_CEILING),
    _P + "TranscribeResult.text": Bound(size=TRANSCRIPT_CHARS),
    _P + "TranscribeResult.segments": Bound(items=TRANSCRIPT_CHARS // 10),
    _P + "GenerateResult.text": Bound(size=MAX_TOKENS_CEILING * CHARS_PER_TOKEN),
    _P + "GenerateDelta.text": Bound(size=MAX_TOKENS_CEILING * CHARS_PER_TOKEN),
}


def bound_of(field: FieldDescriptor) -> Bound:
    return FIELD_BOUNDS.get(field.full_name, DEFAULT_BOUND)


def check_worker_message(message: Message) -> None:
    """Refuse (INVALID_ARGUMENT, naming the field, its limit and its size) a message any field of
    which is past its bound. The error carries no text of the message itself."""
    for path, limit, size in _violations(message, message.DESCRIPTOR.name):
        raise GantryError(
            "INVALID_ARGUMENT",
            f"worker message field {path} is {size} long; the worker protocol allows {limit}",
            field=path,
            limit=str(limit),
            value=str(size),
        )


def _violations(message: Message, path: str) -> Iterator[tuple[str, int, int]]:
    """(field path, limit, size) of each bound `message` breaks, depth first; set fields only."""
    for field, value in message.ListFields():
        bound = bound_of(field)
        where = f"{path}.{field.name}"
        if field.is_repeated:
            if len(value) > bound.items:
                yield where, bound.items, len(value)
                continue
            yield from _entries(field, value, bound, where)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            yield from _violations(value, where)
        elif field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
            if len(value) > bound.size:
                yield where, bound.size, len(value)


def _entries(
    field: FieldDescriptor, value: Any, bound: Bound, where: str
) -> Iterator[tuple[str, int, int]]:
    """The bounds broken inside a repeated or map field whose count is within its bound."""
    if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
        for key, item in value.items():
            for text in (key, item):
                if isinstance(text, str | bytes) and len(text) > bound.size:
                    yield f"{where}[]", bound.size, len(text)
                elif isinstance(text, Message):
                    yield from _violations(text, f"{where}[]")
        return
    for index, item in enumerate(value):
        if isinstance(item, Message):
            yield from _violations(item, f"{where}[{index}]")
        elif isinstance(item, str | bytes) and len(item) > bound.size:
            yield f"{where}[{index}]", bound.size, len(item)
        elif not isinstance(item, str | bytes):
            return  # numbers: the count bounds them


def worker_receive_limit_bytes(limits: InferenceLimits, *, max_dim: int = MAX_EMBED_DIM) -> int:
    """The gRPC receive limit the worker stream's server needs: its largest legal message.

    That is an invocation's result. The widest is an Embed (or EmbedImage) of the most texts (or
    images) a call may carry, each a `max_dim`-float vector of 4 bytes; a ClassifyImage's scores
    (images x labels floats) and a generation's text (`max_tokens` x `CHARS_PER_TOKEN`) are
    compared with it, and the inference envelope (1 MiB) is added for ids and framing.
    """
    vectors = max(limits.max_inputs, limits.max_images) * max_dim * 4
    scores = limits.max_images * limits.max_labels * 4
    text = limits.max_tokens * CHARS_PER_TOKEN * 4  # UTF-8: at most 4 bytes a character
    return REQUEST_ENVELOPE_BYTES + max(vectors, scores, text)

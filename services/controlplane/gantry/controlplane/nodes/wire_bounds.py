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

No field can be longer than the message that holds it is on the wire (a character is at least a
byte, an entry of a repeated or map field at least one), so a message whose serialized size is
within the smallest bound of every field its type can reach breaks none, and is not walked. A
heartbeat is the message of a fleet (each worker's, every interval): an idle one is a few bytes,
and a GPU reading's devices are each within the smallest bound under them, so its check costs a
size per level instead of a Python step per field. Types that can carry a bytes field (results)
are always walked: their size is what the wire carries in bulk, and computing it would cost an
encoding of all of it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from gantry.common.errors import GantryError
from gantry.common.inference_limits import (
    MAX_IMAGES_CEILING,
    MAX_INPUTS_CEILING,
    MAX_TOKENS_CEILING,
    REQUEST_ENVELOPE_BYTES,
    InferenceLimits,
)
from gantry.common.stream_batches import MAX_BATCH_MESSAGES

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
    # A batch's messages: what a worker's outbox sends together (gantry.common.stream_batches).
    _P + "WorkerBatch.messages": Bound(items=MAX_BATCH_MESSAGES),
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


@functools.cache  # per field: looked up for every field of every message a fleet sends
def bound_of(field: FieldDescriptor) -> Bound:
    return FIELD_BOUNDS.get(field.full_name, DEFAULT_BOUND)


def check_worker_message(message: Message) -> None:
    """Refuse (INVALID_ARGUMENT, naming the field, its limit and its size) a message any field of
    which is past its bound. The error carries no text of the message itself."""
    if _too_small_to_break_any(message):
        return
    _refuse_first(_violations(message, message.DESCRIPTOR.name))


def check_batch(message: Message) -> None:
    """A WorkerBatch envelope's own bounds (how many messages it holds, its stamp and trace
    context), refused as `check_worker_message` refuses; each of its messages is checked on its
    own when it is taken, as if it had come alone."""
    name = message.DESCRIPTOR.name
    count = len(message.batch.messages)  # type: ignore[attr-defined]
    batch = message.DESCRIPTOR.fields_by_name["batch"].message_type
    limit = bound_of(batch.fields_by_name["messages"]).items
    if count > limit:
        _refuse_first([(f"{name}.batch.messages", limit, count)])
    _refuse_first(_violations(message, name, skip="batch"))


def _refuse_first(found: Iterable[tuple[str, int, int]]) -> None:
    for path, limit, size in found:
        raise GantryError(
            "INVALID_ARGUMENT",
            f"worker message field {path} is {size} long; the worker protocol allows {limit}",
            field=path,
            limit=str(limit),
            value=str(size),
        )


@functools.cache
def smallest_bound(
    descriptor: Descriptor, chosen: tuple[str | None, ...] | None = None
) -> int | None:
    """The smallest bound (characters, bytes or entries) of any field a message of this type can
    reach, its own and those of every message type under it; None when one of them is a bytes
    field (such a message is always walked, never sized: see the module's docstring).

    `chosen`: the member set in each of the type's own oneofs (`_chosen`), the others left out:
    an envelope whose oneof may hold a result but holds a heartbeat is sized as a heartbeat's."""
    left_out: frozenset[str] = frozenset()
    if chosen is not None:
        left_out = frozenset(
            field.name
            for oneof, member in zip(descriptor.oneofs, chosen, strict=True)
            for field in oneof.fields
            if field.name != member
        )
    smallest: int | None = None
    # The message itself as its oneofs are set; every type under it in full, once (the
    # message's own type too, should it hold one: that one's oneofs may be set otherwise).
    seen: set[str] = set()
    pending = [(descriptor, left_out)]
    while pending:  # every type reachable once: a recursive type ends the walk, not the process
        current, skipped = pending.pop()
        for field in current.fields:
            if field.name in skipped:
                continue
            if field.type == FieldDescriptor.TYPE_BYTES:
                return None
            bound = bound_of(field)
            # Both limits, whatever the field's kind: a lower bound than needed only walks more.
            least = min(bound.size, bound.items)
            smallest = least if smallest is None else min(smallest, least)
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                nested = field.message_type
                if nested.full_name not in seen:
                    seen.add(nested.full_name)
                    pending.append((nested, frozenset()))
    return smallest


@functools.cache
def _oneof_names(descriptor: Descriptor) -> tuple[str, ...]:
    return tuple(oneof.name for oneof in descriptor.oneofs)


def _chosen(message: Message) -> tuple[str | None, ...]:
    """The member set in each of the message's oneofs (None where none is)."""
    return tuple(message.WhichOneof(name) for name in _oneof_names(message.DESCRIPTOR))


def _too_small_to_break_any(message: Message) -> bool:
    """No field is longer than the whole message: one within the smallest bound its type reaches
    (its oneofs as they are set) breaks none, and is not walked."""
    descriptor = message.DESCRIPTOR
    # Most types have no oneof (a GPU's reading, each of its processes): no tuple to build.
    chosen = _chosen(message) if _oneof_names(descriptor) else None
    smallest = smallest_bound(descriptor, chosen)
    return smallest is not None and message.ByteSize() <= smallest


def _violations(message: Message, path: str, *, skip: str = "") -> Iterator[tuple[str, int, int]]:
    """(field path, limit, size) of each bound `message` breaks, depth first; set fields only
    (but `skip`). The caller has sized `message` already (`_too_small_to_break_any`)."""
    for field, value in message.ListFields():
        if field.name == skip:
            continue
        bound = bound_of(field)
        # The path is spelled only where it may be needed: most set fields are numbers.
        if field.is_repeated:
            if len(value) > bound.items:
                yield f"{path}.{field.name}", bound.items, len(value)
                continue
            yield from _entries(field, value, bound, f"{path}.{field.name}")
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if not _too_small_to_break_any(value):
                yield from _violations(value, f"{path}.{field.name}")
        elif field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
            if len(value) > bound.size:
                yield f"{path}.{field.name}", bound.size, len(value)


def _entries(
    field: FieldDescriptor, value: Any, bound: Bound, where: str
) -> Iterator[tuple[str, int, int]]:
    """The bounds broken inside a repeated or map field whose count is within its bound."""
    if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
        for key, item in value.items():
            for text in (key, item):
                if isinstance(text, str | bytes) and len(text) > bound.size:
                    yield f"{where}[]", bound.size, len(text)
                elif isinstance(text, Message) and not _too_small_to_break_any(text):
                    yield from _violations(text, f"{where}[]")
        return
    for index, item in enumerate(value):
        if isinstance(item, Message):
            if not _too_small_to_break_any(item):
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

"""The worker's embedding block as `EmbedResponse.vectors`, written as wire bytes.

The block is `count` rows of `dim` little-endian float32. Both encodings put each row on the wire
unchanged: a `Vector.float32_le` is the row's bytes, and a packed `repeated float values` is, by
protobuf's wire format, the same little-endian float32 bytes behind a length. So the response's
vectors are built by framing each row with two small headers and parsing the result once, in C,
instead of building a Python float per value (FLOAT_LIST) or a message per row: the repeated-float
path then costs what the bytes path costs (PERFORMANCE.md: within 10 %).
"""

from __future__ import annotations

from gantry.common.errors import GantryError
from gantry.v1 import inference_pb2, worker_gateway_pb2

# Tags (field number << 3 | wire type 2, length-delimited) of the fields written here.
_RESPONSE_VECTORS = bytes([1 << 3 | 2])  # EmbedResponse.vectors = 1
_VECTOR_FIELD: dict[int, bytes] = {
    inference_pb2.VECTOR_ENCODING_FLOAT_LIST: bytes([1 << 3 | 2]),  # Vector.values = 1, packed
    inference_pb2.VECTOR_ENCODING_FLOAT32_LE_BYTES: bytes([2 << 3 | 2]),  # Vector.float32_le = 2
}


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def vectors_wire(result: worker_gateway_pb2.EmbedResult, encoding: int) -> bytes:
    """`EmbedResponse.vectors` for `result` in `encoding`, as serialized fields: merge them into
    the response with `MergeFromString`. A block whose size disagrees with count x dim is the
    worker's fault (INVOKE_FAILED), never sent on."""
    row_bytes = result.dim * 4
    # Read the field once: each read of a bytes field copies the whole block.
    block = result.float32_le
    if len(block) != row_bytes * result.count:
        raise GantryError("INVOKE_FAILED", "the worker returned a malformed embedding block")
    if encoding not in _VECTOR_FIELD:
        encoding = inference_pb2.VECTOR_ENCODING_FLOAT_LIST
    inner = _VECTOR_FIELD[encoding] + _varint(row_bytes)
    header = _RESPONSE_VECTORS + _varint(len(inner) + row_bytes) + inner
    if row_bytes == 0:
        # An empty row is an empty Vector (its field absent), one per input.
        return (_RESPONSE_VECTORS + b"\x00") * result.count
    view = memoryview(block)
    parts: list[bytes | memoryview] = []
    for offset in range(0, len(block), row_bytes):
        parts.append(header)
        parts.append(view[offset : offset + row_bytes])
    return b"".join(parts)

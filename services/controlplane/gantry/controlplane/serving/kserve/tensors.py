"""KServe v2 tensors <-> Python values: a request's inputs decoded (typed contents or raw bytes),
a response's outputs encoded. Pure: no grpc server, no database.

Raw contents are the flattened row-major elements, little-endian; a BYTES element is a 4-byte
little-endian length and its bytes. A tensor whose element count disagrees with its shape, a
datatype this front door does not read, or raw and typed contents mixed in one request is
INVALID_ARGUMENT naming the tensor: the client's mistake, never sent on.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gantry.common.errors import invalid_argument
from gantry.kserve import grpc_service_pb2 as kserve

BYTES = "BYTES"
FP32 = "FP32"
INT32 = "INT32"

# Datatype -> (struct format of one element, the InferTensorContents field that holds it).
_NUMERIC: Mapping[str, tuple[str, str]] = {
    "BOOL": ("?", "bool_contents"),
    "INT8": ("b", "int_contents"),
    "INT16": ("h", "int_contents"),
    "INT32": ("i", "int_contents"),
    "INT64": ("q", "int64_contents"),
    "UINT8": ("B", "uint_contents"),
    "UINT16": ("H", "uint_contents"),
    "UINT32": ("I", "uint_contents"),
    "UINT64": ("Q", "uint64_contents"),
    "FP32": ("f", "fp32_contents"),
    "FP64": ("d", "fp64_contents"),
}
INTEGER_TYPES = frozenset(name for name in _NUMERIC if name.startswith(("INT", "UINT")))
FLOAT_TYPES = frozenset({"FP32", "FP64"})
Element = bytes | int | float | bool


@dataclass(frozen=True, slots=True)
class InputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    values: tuple[Element, ...]  # flattened, row-major
    parameters: Mapping[str, kserve.InferParameter] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class OutputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes  # the raw encoding (raw_output_contents); typed contents are made from it


def _element_count(name: str, shape: Sequence[int]) -> int:
    if any(dim < 0 for dim in shape):
        raise invalid_argument(
            f"input tensor {name!r} has a negative dimension in its shape {list(shape)}",
            field=name,
        )
    return math.prod(shape)


def _decode_bytes_raw(name: str, raw: bytes, count: int) -> tuple[bytes, ...]:
    values: list[bytes] = []
    offset = 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise invalid_argument(
                f"input tensor {name!r} ends inside an element's 4-byte length", field=name
            )
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise invalid_argument(
                f"input tensor {name!r} has an element of {length} bytes past its end", field=name
            )
        values.append(raw[offset : offset + length])
        offset += length
    if len(values) != count:
        raise invalid_argument(
            f"input tensor {name!r} holds {len(values)} elements; its shape says {count}",
            field=name,
        )
    return tuple(values)


def decode_raw(name: str, datatype: str, raw: bytes, count: int) -> tuple[Element, ...]:
    """`count` elements of `datatype` from their raw encoding (a BYTES element length-prefixed)."""
    if datatype == BYTES:
        return _decode_bytes_raw(name, raw, count)
    element, _ = _NUMERIC[datatype]
    size = struct.calcsize(element)
    if len(raw) != size * count:
        raise invalid_argument(
            f"input tensor {name!r} has {len(raw)} raw bytes; {count} {datatype} elements are "
            f"{size * count}",
            field=name,
        )
    return tuple(struct.unpack(f"<{count}{element}", raw))


def _decode_contents(
    name: str, datatype: str, contents: kserve.InferTensorContents, count: int
) -> tuple[Element, ...]:
    holder = "bytes_contents" if datatype == BYTES else _NUMERIC[datatype][1]
    values = tuple(getattr(contents, holder))
    if len(values) != count:
        raise invalid_argument(
            f"input tensor {name!r} holds {len(values)} elements in contents.{holder}; its shape "
            f"says {count}",
            field=name,
        )
    return values


def check_datatype(name: str, datatype: str) -> None:
    if datatype != BYTES and datatype not in _NUMERIC:
        raise invalid_argument(
            f"input tensor {name!r} has datatype {datatype!r}; this server reads "
            f"{', '.join([BYTES, *_NUMERIC])}",
            field=name,
        )


def _fits(datatype: str, value: object) -> bool:
    """Whether a JSON element can be a `datatype` element (a bool is no number here)."""
    if datatype == "BOOL":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, float | int) if datatype in FLOAT_TYPES else isinstance(value, int)


def encode_raw(name: str, datatype: str, values: Sequence[object]) -> bytes:
    """Typed elements (a JSON tensor's `data`, flattened) as their raw encoding; an element of
    the wrong type for `datatype` is INVALID_ARGUMENT naming the tensor."""
    check_datatype(name, datatype)
    if datatype == BYTES:
        if not all(isinstance(value, str) for value in values):
            raise invalid_argument(
                f"input tensor {name!r} is BYTES: its data are strings", field=name
            )
        return bytes_output(name, [str(value).encode() for value in values], (len(values),)).raw
    if not all(_fits(datatype, value) for value in values):
        raise invalid_argument(
            f"input tensor {name!r} has data that are not {datatype} elements", field=name
        )
    try:
        return struct.pack(f"<{len(values)}{_NUMERIC[datatype][0]}", *values)
    except struct.error:
        raise invalid_argument(
            f"input tensor {name!r} has an element out of {datatype}'s range", field=name
        ) from None


def decode_inputs(request: kserve.ModelInferRequest) -> dict[str, InputTensor]:
    """The request's input tensors by name, their elements decoded."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise invalid_argument(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs: one per "
            "input, in order",
            field="raw_input_contents",
        )
    tensors: dict[str, InputTensor] = {}
    for index, tensor in enumerate(request.inputs):
        name = tensor.name
        if name in tensors:
            raise invalid_argument(f"input tensor {name!r} is given twice", field=name)
        check_datatype(name, tensor.datatype)
        count = _element_count(name, tensor.shape)
        if raw:
            if tensor.HasField("contents"):
                raise invalid_argument(
                    f"input tensor {name!r} has contents beside raw_input_contents: use one",
                    field=name,
                )
            values = decode_raw(name, tensor.datatype, raw[index], count)
        else:
            values = _decode_contents(name, tensor.datatype, tensor.contents, count)
        tensors[name] = InputTensor(
            name=name,
            datatype=tensor.datatype,
            shape=tuple(tensor.shape),
            values=values,
            parameters=dict(tensor.parameters),
        )
    return tensors


def bytes_output(name: str, values: Sequence[bytes], shape: Sequence[int]) -> OutputTensor:
    raw = b"".join(struct.pack("<I", len(value)) + value for value in values)
    return OutputTensor(name=name, datatype=BYTES, shape=tuple(shape), raw=raw)


def fp32_output(name: str, raw: bytes, shape: Sequence[int]) -> OutputTensor:
    """An FP32 tensor from its little-endian block (a worker's embedding block is one as is)."""
    if len(raw) != 4 * math.prod(shape):
        raise ValueError(f"{len(raw)} bytes are not an FP32 tensor of shape {list(shape)}")
    return OutputTensor(name=name, datatype=FP32, shape=tuple(shape), raw=raw)


def fp32_values(name: str, values: Sequence[float], shape: Sequence[int]) -> OutputTensor:
    return fp32_output(name, struct.pack(f"<{len(values)}f", *values), shape)


def _typed_contents(output: OutputTensor) -> kserve.InferTensorContents:
    count = math.prod(output.shape)
    if output.datatype == BYTES:
        return kserve.InferTensorContents(
            bytes_contents=list(_decode_bytes_raw(output.name, output.raw, count))
        )
    element, holder = _NUMERIC[output.datatype]
    values = struct.unpack(f"<{count}{element}", output.raw)
    return kserve.InferTensorContents(**{holder: values})


def add_outputs(
    response: kserve.ModelInferResponse, outputs: Sequence[OutputTensor], *, raw: bool
) -> None:
    """The outputs into `response`: as raw_output_contents (what tritonclient reads, and what
    Triton sends), or, with `raw` False, as typed contents (readable in grpcurl's JSON)."""
    for output in outputs:
        tensor = response.outputs.add(
            name=output.name, datatype=output.datatype, shape=list(output.shape)
        )
        if raw:
            response.raw_output_contents.append(output.raw)
        else:
            tensor.contents.CopyFrom(_typed_contents(output))

"""llama.cpp's GGUF files, read from a bounded head: the header, the metadata, the tensor infos.

Nothing past `HEAD_LIMIT` bytes is read, nothing is executed, and nothing read is kept but the
few facts reported (a chat template's presence, never its text). Every count or length the header
claims is checked against the file's size before anything loops over it or slices it, so a
hostile header (2^60 keys, a 2^63-byte string, an unknown value type, an array of arrays) is
refused in constant time and memory. A head that ends before the metadata does is reported cut
short (`metadata_truncated`); a whole file that does is truncated, and refused.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from gantry.common.artifact_gate import MAX_CONFIG_BYTES
from gantry.worker.inspection.artifact_files import (
    INCOMPATIBLE,
    NOTE,
    ArtifactFiles,
    Draft,
    finding,
)

MAGIC = b"GGUF"
# llama.cpp's conversions store the whole vocabulary (tokens, scores, merges: about 8 MB for
# Llama 3's 128k tokens) in the metadata, ahead of the chat template and the tensor infos, so a
# 1 MiB head ended inside it. The bound a config file gets covers current vocabularies; the
# weights that follow are never read.
HEAD_LIMIT = MAX_CONFIG_BYTES
# The adapter that would serve a GGUF: llama.cpp's OpenAI-compatible server, managed by the worker.
CANDIDATE_ADAPTER = "llama_cpp_server"
VERSIONS = (2, 3)  # version 1 had 32-bit counts; llama.cpp reads neither it nor later ones

# general.file_type (llama.cpp's llama_ftype) -> the name llama-quantize gives it.
FILE_TYPES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    4: "Q4_1_SOME_F16",  # removed from llama.cpp, as are 33-35
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    33: "Q4_0_4_4",
    34: "Q4_0_4_8",
    35: "Q4_0_8_8",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
    39: "NVFP4",
    40: "Q1_0",
}


class GgmlType(NamedTuple):
    """A tensor's storage type: `block_bytes` bytes hold `block_elements` values."""

    name: str
    block_elements: int
    block_bytes: int


# A tensor info's ggml_type -> its storage (ggml's type traits, as the gguf package lists them).
GGML_TYPES: dict[int, GgmlType] = {
    number: GgmlType(name, elements, size)
    for number, (name, elements, size) in {
        0: ("F32", 1, 4),
        1: ("F16", 1, 2),
        2: ("Q4_0", 32, 18),
        3: ("Q4_1", 32, 20),
        6: ("Q5_0", 32, 22),
        7: ("Q5_1", 32, 24),
        8: ("Q8_0", 32, 34),
        9: ("Q8_1", 32, 40),
        10: ("Q2_K", 256, 84),
        11: ("Q3_K", 256, 110),
        12: ("Q4_K", 256, 144),
        13: ("Q5_K", 256, 176),
        14: ("Q6_K", 256, 210),
        15: ("Q8_K", 256, 292),
        16: ("IQ2_XXS", 256, 66),
        17: ("IQ2_XS", 256, 74),
        18: ("IQ3_XXS", 256, 98),
        19: ("IQ1_S", 256, 50),
        20: ("IQ4_NL", 32, 18),
        21: ("IQ3_S", 256, 110),
        22: ("IQ2_S", 256, 82),
        23: ("IQ4_XS", 256, 136),
        24: ("I8", 1, 1),
        25: ("I16", 1, 2),
        26: ("I32", 1, 4),
        27: ("I64", 1, 8),
        28: ("F64", 1, 8),
        29: ("IQ1_M", 256, 56),
        30: ("BF16", 1, 2),
        34: ("TQ1_0", 256, 54),
        35: ("TQ2_0", 256, 66),
        39: ("MXFP4", 32, 17),
        40: ("NVFP4", 64, 36),
        41: ("Q1_0", 128, 18),
    }.items()
}

# Metadata value types: the scalars' formats; a string is a u64 length and bytes; an array a u32
# item type, a u64 count and the items.
_SCALARS = {
    0: struct.Struct("<B"),
    1: struct.Struct("<b"),
    2: struct.Struct("<H"),
    3: struct.Struct("<h"),
    4: struct.Struct("<I"),
    5: struct.Struct("<i"),
    6: struct.Struct("<f"),
    7: struct.Struct("<?"),
    10: struct.Struct("<Q"),
    11: struct.Struct("<q"),
    12: struct.Struct("<d"),
}
_STRING = 8
_ARRAY = 9
_U32 = _SCALARS[4]
_U64 = _SCALARS[10]
_SMALLEST_KEY = 8 + 4 + 1  # an empty name, the type, a one-byte value
_SMALLEST_TENSOR_INFO = 8 + 4 + 4 + 8  # an empty name, no dimensions, the type, the offset
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_NAME_BYTES = 63  # GGML_MAX_NAME less its terminator
_INT64_MAX = (1 << 63) - 1
_DEFAULT_ALIGNMENT = 32
_KEPT_TEXT = 256  # bytes of a reported string value (a name, a tokenizer model)
_MAX_REPORTED = 64  # keys kept: any "*.block_count" is kept, so a hostile file could name many

# Keys whose values are reported; and, with any architecture prefix, the model's dimensions.
_REPORTED = frozenset(
    {
        "general.architecture",
        "general.name",
        "general.file_type",
        "general.quantization_version",
        "general.alignment",
        "tokenizer.ggml.model",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "split.count",
    }
)
_ARCHITECTURE_KEYS = ("context_length", "embedding_length", "block_count")
_CHAT_TEMPLATE = "tokenizer.chat_template"  # its presence only
_VOCABULARY = "tokenizer.ggml.tokens"  # its length only
_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<index>\d{5})-of-(?P<total>\d{5})\.gguf$", re.IGNORECASE)


class HeaderError(Exception):
    """The header cannot be a GGUF that llama.cpp loads (llama.cpp refuses the same)."""


class _Truncated(Exception):
    """The bytes read end before the header does."""


@dataclass
class TensorSummary:
    """What the tensor infos add up to; types are counted, names are not kept."""

    type_counts: dict[str, int] = field(default_factory=dict)
    type_bytes: dict[str, int] = field(default_factory=dict)
    elements: int = 0
    unknown_types: set[int] = field(default_factory=set)
    data_start: int = 0  # where the tensor data begins (the infos' end, aligned)
    data_end: int = 0  # the furthest byte a tensor claims, relative to data_start

    @property
    def tensor_bytes(self) -> int | None:
        """The tensors' bytes; None when a type's size is unknown here."""
        return None if self.unknown_types else sum(self.type_bytes.values())

    def dominant_type(self) -> str:
        """The type holding the most bytes (the most tensors when bytes are unknown)."""
        weight = self.type_bytes if not self.unknown_types else self.type_counts
        return max(sorted(weight), key=lambda name: weight[name]) if weight else ""


@dataclass
class GgufHeader:
    version: int
    tensor_count: int
    key_count: int
    metadata: dict[str, object] = field(default_factory=dict)  # reported keys only
    has_chat_template: bool = False
    vocabulary_size: int | None = None
    metadata_complete: bool = False
    tensors: TensorSummary | None = None  # None unless every tensor info was within the head


class _Reader:
    """A cursor over the head that knows the whole file's size, to check claims against it."""

    def __init__(self, head: bytes, file_size: int) -> None:
        self.head = head
        self.file_size = file_size
        self.offset = 0

    def skip(self, size: int) -> None:
        """Step over `size` bytes the header claims: past the file's end is a lie, refused before
        anything is sliced; past the head, the head stops short."""
        if size > self.file_size - self.offset:
            raise HeaderError(
                f"claims {size} bytes at offset {self.offset}, past the end of the file "
                f"({self.file_size} bytes)"
            )
        if self.offset + size > len(self.head):
            raise _Truncated
        self.offset += size

    def scalar(self, layout: struct.Struct) -> object:
        if self.offset + layout.size > len(self.head):
            raise _Truncated
        value: object = layout.unpack_from(self.head, self.offset)[0]
        self.offset += layout.size
        return value

    def u32(self) -> int:
        value = self.scalar(_U32)
        assert isinstance(value, int)
        return value

    def u64(self) -> int:
        value = self.scalar(_U64)
        assert isinstance(value, int)
        return value

    def string(self, keep: int) -> str | None:
        """The string's first `keep` bytes decoded, or None (skipped) when `keep` is 0."""
        length = self.u64()
        start = self.offset
        self.skip(length)
        if not keep:
            return None
        return self.head[start : start + min(length, keep)].decode("utf-8", errors="replace")

    def value(self, kind: int, *, keep: bool) -> object:
        """A metadata value: scalars and (kept) strings as Python values; arrays skipped, their
        length returned."""
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string(_KEPT_TEXT if keep else 0)
        if kind == _ARRAY:
            return self.array()
        raise HeaderError(f"unknown metadata value type {kind} at offset {self.offset - 4}")

    def array(self) -> int:
        item_kind = self.u32()
        count = self.u64()
        if item_kind == _ARRAY:
            raise HeaderError("holds an array of arrays (llama.cpp reads none)")
        if item_kind == _STRING:
            smallest = _U64.size
        elif item_kind in _SCALARS:
            smallest = _SCALARS[item_kind].size
        else:
            raise HeaderError(f"unknown array item type {item_kind} at offset {self.offset - 12}")
        if count * smallest > self.file_size - self.offset:
            raise HeaderError(
                f"claims an array of {count} items at offset {self.offset}, more than the "
                f"file's {self.file_size} bytes can hold"
            )
        if item_kind == _STRING:
            # Each length is checked against the file before it is skipped, and each item takes
            # at least 8 bytes of the head, so this loop ends within the head.
            for _ in range(count):
                self.skip(self.u64())
        else:
            self.skip(count * smallest)
        return count


def read_header(head: bytes, file_size: int) -> GgufHeader:
    """The header of a GGUF file of `file_size` bytes from its first bytes `head` (which start
    with the magic). Raises HeaderError for a header llama.cpp would refuse, including a whole
    file that ends inside it; a head that merely stops short leaves the rest unset."""
    reader = _Reader(head, file_size)
    try:
        reader.skip(len(MAGIC))
        version = reader.u32()
        if version not in VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            endian = " (a big-endian file?)" if swapped in VERSIONS else ""
            raise HeaderError(
                f"GGUF version {version}{endian} is not read (versions "
                f"{', '.join(map(str, VERSIONS))})"
            )
        header = GgufHeader(version=version, tensor_count=reader.u64(), key_count=reader.u64())
    except _Truncated:
        raise HeaderError("ends inside its GGUF header (the file is truncated)") from None
    _check_count(header.key_count, _SMALLEST_KEY, "metadata keys", reader)
    _check_count(header.tensor_count, _SMALLEST_TENSOR_INFO, "tensors", reader)
    try:
        _read_metadata(reader, header)
        header.metadata_complete = True
        header.tensors = _read_tensor_infos(reader, header)
    except _Truncated:
        if len(head) >= file_size:
            raise HeaderError("ends inside its GGUF header (the file is truncated)") from None
    return header


def _check_count(count: int, smallest: int, what: str, reader: _Reader) -> None:
    room = reader.file_size - reader.offset
    if count * smallest > room:
        raise HeaderError(
            f"claims {count} {what}, more than a file of {reader.file_size} bytes can hold"
        )


def _read_metadata(reader: _Reader, header: GgufHeader) -> None:
    for _ in range(header.key_count):
        key = reader.string(_KEPT_TEXT + 1) or ""
        kind = reader.u32()
        reported = key in _REPORTED or key.rsplit(".", 1)[-1] in _ARCHITECTURE_KEYS
        value = reader.value(kind, keep=reported)
        if key == _CHAT_TEMPLATE:
            header.has_chat_template = True
        elif key == _VOCABULARY and kind == _ARRAY:
            assert isinstance(value, int)
            header.vocabulary_size = value
        elif reported and kind != _ARRAY and len(header.metadata) < _MAX_REPORTED:
            header.metadata[key] = value


def _read_tensor_infos(reader: _Reader, header: GgufHeader) -> TensorSummary:
    summary = TensorSummary()
    for _ in range(header.tensor_count):
        name_bytes = reader.u64()
        if name_bytes > _MAX_NAME_BYTES:
            raise HeaderError(
                f"names a tensor with {name_bytes} bytes (llama.cpp's limit is {_MAX_NAME_BYTES})"
            )
        reader.skip(name_bytes)
        dimensions = reader.u32()
        if dimensions > _MAX_DIMS:
            raise HeaderError(f"gives a tensor {dimensions} dimensions (at most {_MAX_DIMS})")
        shape = [reader.u64() for _ in range(dimensions)]
        if any(extent > _INT64_MAX for extent in shape):
            raise HeaderError("gives a tensor a dimension past 2^63 - 1")
        type_number = reader.u32()
        data_offset = reader.u64()
        elements = 1
        for extent in shape:
            elements *= extent
        summary.elements += elements
        ggml_type = GGML_TYPES.get(type_number)
        name = ggml_type.name if ggml_type else f"type {type_number}"
        summary.type_counts[name] = summary.type_counts.get(name, 0) + 1
        if ggml_type is None:
            summary.unknown_types.add(type_number)
            continue
        if shape and shape[0] % ggml_type.block_elements:
            raise HeaderError(
                f"gives a {ggml_type.name} tensor rows of {shape[0]} values, not a multiple "
                f"of its {ggml_type.block_elements}-value blocks"
            )
        size = elements // ggml_type.block_elements * ggml_type.block_bytes
        summary.type_bytes[name] = summary.type_bytes.get(name, 0) + size
        summary.data_end = max(summary.data_end, data_offset + size)
    alignment = header.metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise HeaderError(f"general.alignment {alignment} is not a power of two")
    summary.data_start = -(-reader.offset // alignment) * alignment
    if summary.data_start + summary.data_end > reader.file_size:
        raise HeaderError(
            f"places tensor data up to byte {summary.data_start + summary.data_end}, past the "
            f"end of the file ({reader.file_size} bytes): the file is truncated"
        )
    return summary


def model_files(paths: list[str], sizes: Mapping[str, int]) -> list[str]:
    """The model's GGUF files, the one holding the metadata first: the largest file (smaller ones
    are usually projectors), or every shard of a split model (llama.cpp's gguf-split names them
    NAME-00001-of-0000N.gguf and reads the metadata from the first)."""
    largest = max(paths, key=lambda path: (sizes[path], path))
    split = _SPLIT.match(largest)
    if split is None:
        return [largest]
    shards = []
    for path in paths:
        shard = _SPLIT.match(path)
        if shard and (shard["stem"], shard["total"]) == (split["stem"], split["total"]):
            shards.append(path)
    return sorted(shards)


def header_details(header: GgufHeader) -> dict[str, str]:
    """The facts a profile and an envelope need, as details strings."""
    metadata = header.metadata
    details = {
        "gguf_version": str(header.version),
        "tensor_count": str(header.tensor_count),
        "metadata_keys": str(header.key_count),
    }
    architecture = metadata.get("general.architecture")
    for key in sorted(_REPORTED):
        if key in metadata:
            details[key] = str(metadata[key])
    if isinstance(architecture, str):
        for name in _ARCHITECTURE_KEYS:
            key = f"{architecture}.{name}"
            if key in metadata:
                details[key] = str(metadata[key])
        if f"{architecture}.context_length" in metadata:
            details["context_length"] = str(metadata[f"{architecture}.context_length"])
    if header.vocabulary_size is not None:
        details["vocab_size"] = str(header.vocabulary_size)
    # Absent only means absent when every key was read.
    if header.has_chat_template or header.metadata_complete:
        details["chat_template"] = "true" if header.has_chat_template else "false"
    file_type = metadata.get("general.file_type")
    if isinstance(file_type, int) and not isinstance(file_type, bool):
        details["quantization"] = FILE_TYPES.get(file_type, f"file_type {file_type}")
    tensors = header.tensors
    if tensors is not None:
        by_weight = sorted(
            tensors.type_counts, key=lambda name: (-tensors.type_bytes.get(name, 0), name)
        )
        details["tensor_types"] = ",".join(f"{t}:{tensors.type_counts[t]}" for t in by_weight)
        details["dominant_tensor_type"] = tensors.dominant_type()
        details["parameter_count_estimate"] = str(tensors.elements)
        if tensors.tensor_bytes is not None:
            details["tensor_bytes"] = str(tensors.tensor_bytes)
        details.setdefault("quantization", tensors.dominant_type())
    return details


def inspect(files: ArtifactFiles) -> Draft:
    paths = files.ending(".gguf")
    model = model_files(paths, files.sizes)
    main = model[0]
    draft = Draft(
        inspector="gguf", key_path=main, model_type="gguf", modalities=["text"], task="generation"
    )
    if len(paths) > 1:
        draft.details["gguf_files"] = ",".join(paths)
    head = files.read(main, HEAD_LIMIT)
    if head[: len(MAGIC)] != MAGIC:
        draft.findings.append(
            finding(INCOMPATIBLE, f"{main} is named .gguf but lacks the GGUF magic", main)
        )
        return draft
    try:
        header = read_header(head, files.sizes[main])
    except HeaderError as error:
        draft.findings.append(finding(INCOMPATIBLE, f"{main} {error}", main))
        return draft
    draft.details.update(header_details(header))
    draft.model_type = draft.details.get("general.architecture", "gguf")
    if not header.metadata_complete or header.tensors is None:
        draft.details["metadata_truncated"] = "true"
    if header.tensors is not None and header.tensors.unknown_types:
        unknown = ", ".join(map(str, sorted(header.tensors.unknown_types)))
        draft.findings.append(
            finding(
                NOTE,
                f"{main} holds tensors of ggml types this inspector does not know ({unknown}); "
                "their bytes are not counted, and only a llama.cpp that knows them loads the file",
                main,
            )
        )
    # What the envelope needs before a probe measures it: the weights' bytes as stored. llama.cpp
    # maps them whole, so the file size bounds the load from below; the KV cache for the context
    # and the compute buffers come on top.
    draft.details["weights_bytes_estimate"] = str(sum(files.sizes[path] for path in model))
    draft.details["weights_bytes_basis"] = (
        f"size of {', '.join(model)}: a lower bound of a load's memory (the KV cache and "
        "compute buffers come on top)"
    )
    draft.details["candidate_adapters"] = CANDIDATE_ADAPTER  # dispatch.CANDIDATE_ADAPTERS
    return draft

"""What safetensors files hold, from their headers alone: tensor counts, dtypes, elements, bytes.

A safetensors file starts with a little-endian u64 header length and that many bytes of JSON
naming each tensor's dtype, shape and byte range. Only that header is read: its length is
checked against the file and against `MAX_CONFIG_BYTES` (and all headers of a set together
against `HEADER_BUDGET`) before it is read, so a hostile length costs nothing; the tensor data
is never touched.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from gantry.common.artifact_gate import MAX_CONFIG_BYTES
from gantry.worker.inspection.artifact_files import ArtifactFiles

_LENGTH = struct.Struct("<Q")
HEADER_BUDGET = 4 * MAX_CONFIG_BYTES  # every shard's header together (DeepSeek-V3's: ~16 MB)


class UnreadableHeader(Exception):
    """A file whose header is not one safetensors would load, or one past the bounds."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


@dataclass
class TensorTotals:
    """The tensors of one or more safetensors files, added up (names are not kept)."""

    tensors: int = 0
    elements: int = 0
    data_bytes: int = 0
    dtype_counts: dict[str, int] = field(default_factory=dict)
    dtype_bytes: dict[str, int] = field(default_factory=dict)

    def add(self, dtype: str, elements: int, size: int) -> None:
        self.tensors += 1
        self.elements += elements
        self.data_bytes += size
        self.dtype_counts[dtype] = self.dtype_counts.get(dtype, 0) + 1
        self.dtype_bytes[dtype] = self.dtype_bytes.get(dtype, 0) + size

    def dtypes(self) -> str:
        """ "BF16:290,F32:65": each dtype's tensor count, the most bytes first."""
        ordered = sorted(self.dtype_counts, key=lambda name: (-self.dtype_bytes[name], name))
        return ",".join(f"{name}:{self.dtype_counts[name]}" for name in ordered)


def header_of(files: ArtifactFiles, path: str, budget: int) -> tuple[dict[str, Any], int]:
    """The parsed header of `path` and its length, read only if it is at most `budget` bytes."""
    size = files.sizes[path]
    if size < _LENGTH.size:
        raise UnreadableHeader(path, f"{size} bytes, shorter than a safetensors header")
    (length,) = _LENGTH.unpack(files.read(path, _LENGTH.size)[: _LENGTH.size])
    if length > size - _LENGTH.size:
        raise UnreadableHeader(
            path, f"claims a {length}-byte header in a file of {size} bytes (truncated?)"
        )
    if length > min(MAX_CONFIG_BYTES, budget):
        raise UnreadableHeader(
            path,
            f"a {length}-byte header, past the {min(MAX_CONFIG_BYTES, budget)} bytes "
            "inspection reads",
        )
    raw = files.read(path, _LENGTH.size + length)[_LENGTH.size :]
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UnreadableHeader(path, f"the header is not UTF-8 JSON: {exc}") from None
    if not isinstance(header, dict):
        raise UnreadableHeader(path, "the header is not a JSON object")
    return header, length


def add_header(totals: TensorTotals, header: dict[str, Any], data_size: int, path: str) -> None:
    """Add each tensor of one header, checked as safetensors checks it: a dtype, a shape of
    whole numbers, a byte range inside the file's data."""
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise UnreadableHeader(path, f"tensor {name!r} is not described by an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if (
            not isinstance(dtype, str)
            or not _whole_numbers(shape)
            or not _whole_numbers(offsets)
            or len(offsets) != 2
            or not offsets[0] <= offsets[1] <= data_size
        ):
            raise UnreadableHeader(
                path, f"tensor {name!r} lacks a dtype, a shape or a byte range inside the file"
            )
        elements = 1
        for extent in shape:
            elements *= extent
        totals.add(dtype, elements, offsets[1] - offsets[0])


def _whole_numbers(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(
        isinstance(item, int) and not isinstance(item, bool) and item >= 0 for item in value
    )


def tensor_totals(files: ArtifactFiles, paths: list[str]) -> TensorTotals:
    """The totals of every file in `paths`; UnreadableHeader names the first that fails."""
    totals = TensorTotals()
    budget = HEADER_BUDGET
    for path in paths:
        header, length = header_of(files, path, budget)
        budget -= length
        add_header(totals, header, files.sizes[path] - _LENGTH.size - length, path)
    return totals

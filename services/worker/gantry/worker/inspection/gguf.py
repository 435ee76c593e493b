"""llama.cpp's GGUF files: the magic, the header counts and the `general.*` metadata keys.

Only the head of the file is read (`HEAD_LIMIT`); keys past it, or past a value too large to
hold, are left out and the details say the metadata was cut short.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from gantry.worker.inspection.artifact_files import INCOMPATIBLE, ArtifactFiles, Draft, finding

MAGIC = b"GGUF"
HEAD_LIMIT = 1 << 20
_MAX_KEYS = 4096
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING = 8
_ARRAY = 9
# Keys worth reporting (with "{arch}" the model's architecture).
_WANTED = (
    "general.architecture",
    "general.name",
    "general.file_type",
    "general.quantization_version",
    "{arch}.context_length",
    "{arch}.embedding_length",
    "{arch}.block_count",
)


class _Truncated(Exception):
    """The head ends before the metadata does."""


@dataclass
class _Cursor:
    data: bytes
    offset: int = 0

    def take(self, size: int) -> bytes:
        if self.offset + size > len(self.data):
            raise _Truncated
        chunk = self.data[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def unpack(self, fmt: str) -> object:
        value: object = struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        assert isinstance(length, int)
        return self.take(length).decode("utf-8", errors="replace")

    def value(self, kind: int) -> object:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind = self.unpack("<I")
            count = self.unpack("<Q")
            assert isinstance(item_kind, int) and isinstance(count, int)
            for _ in range(count):  # skipped: token lists and the like are not worth reporting
                self.value(item_kind)
            return None
        raise ValueError(f"unknown GGUF value type {kind}")


def read_header(head: bytes) -> tuple[dict[str, str], bool]:
    """(details, complete) from the head of a GGUF file that starts with the magic."""
    cursor = _Cursor(head, len(MAGIC))
    details: dict[str, str] = {}
    metadata: dict[str, object] = {}
    try:
        version = cursor.unpack("<I")
        details["gguf_version"] = str(version)
        tensors = cursor.unpack("<Q")
        keys = cursor.unpack("<Q")
        details["tensor_count"] = str(tensors)
        details["metadata_keys"] = str(keys)
        assert isinstance(keys, int)
        for _ in range(min(keys, _MAX_KEYS)):
            key = cursor.string()
            kind = cursor.unpack("<I")
            assert isinstance(kind, int)
            metadata[key] = cursor.value(kind)
        complete = True
    except (_Truncated, ValueError, struct.error):
        complete = False
    architecture = metadata.get("general.architecture")
    for wanted in _WANTED:
        if "{arch}" in wanted:
            if not isinstance(architecture, str):
                continue
            wanted = wanted.format(arch=architecture)
        if metadata.get(wanted) is not None:
            details[wanted] = str(metadata[wanted])
    return details, complete


def inspect(files: ArtifactFiles) -> Draft:
    paths = files.ending(".gguf")
    # The largest file is the model; smaller ones are usually projectors or vocabularies.
    main = max(paths, key=lambda path: (files.sizes[path], path))
    draft = Draft(inspector="gguf", key_path=main, modalities=["text"], task="generation")
    head = files.read(main, HEAD_LIMIT)
    if head[: len(MAGIC)] != MAGIC:
        draft.findings.append(
            finding(INCOMPATIBLE, f"{main} is named .gguf but lacks the GGUF magic", main)
        )
        draft.model_type = "gguf"
        return draft
    details, complete = read_header(head)
    if not complete:
        details["metadata_truncated"] = "true"
    draft.details = details
    draft.model_type = details.get("general.architecture", "gguf")
    if len(paths) > 1:
        draft.details["gguf_files"] = ",".join(paths)
    return draft

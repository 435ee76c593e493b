"""Artifact locations under the root, the hard-linked copy, gating and hashing to a manifest."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from gantry.cli.artifacts import artifact_location, hash_directory, place_copy
from gantry.cli.errors import CliError
from gantry.common.errors import GantryError
from tests.fixtures.hostile_artifacts import BY_KIND, HOSTILE_KINDS, write_hostile_artifact


@pytest.fixture
def root(tmp_path: Path) -> Path:
    artifact_root = tmp_path / "artifacts"
    (artifact_root / "models" / "minilm").mkdir(parents=True)
    return artifact_root


def test_a_directory_under_the_root_gets_its_relative_location(root: Path) -> None:
    assert artifact_location(root / "models" / "minilm", root) == "models/minilm"
    assert artifact_location(root / "models" / ".." / "models", root) == "models"


def test_a_directory_outside_the_root_is_refused_with_what_to_do(
    root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with pytest.raises(CliError, match="not under the artifact root") as caught:
        artifact_location(outside, root)
    assert "place the model directory there" in str(caught.value)


def test_the_root_itself_and_missing_directories_are_refused(root: Path) -> None:
    with pytest.raises(CliError, match="is the artifact root itself") as caught:
        artifact_location(root, root)
    # Not the outside-the-root advice, which would copy the root into itself.
    assert "cp -r" not in str(caught.value)
    assert f"gantry artifacts register {root}/MODEL_NAME" in str(caught.value)
    with pytest.raises(CliError, match="holds the artifact root"):
        artifact_location(root.parent, root)
    with pytest.raises(CliError, match="not a directory"):
        artifact_location(root / "missing", root)


def test_a_link_inside_the_root_that_points_outside_is_refused(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside-model"
    outside.mkdir()
    (root / "sneaky").symlink_to(outside)
    with pytest.raises(CliError, match="not under the artifact root"):
        artifact_location(root / "sneaky", root)


def test_place_copy_links_files_and_skips_an_existing_copy(tmp_path: Path) -> None:
    source = tmp_path / "bundled"
    (source / "1_Pooling").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "1_Pooling" / "config.json").write_text('{"pooling": "mean"}')
    destination = tmp_path / "artifacts" / "model"
    destination.parent.mkdir()

    assert place_copy(source, destination)
    copied = destination / "1_Pooling" / "config.json"
    assert copied.read_text() == '{"pooling": "mean"}'
    assert os.stat(copied).st_ino == os.stat(source / "1_Pooling" / "config.json").st_ino
    assert not place_copy(source, destination)
    assert not any(p.name.startswith(".model.partial") for p in destination.parent.iterdir())


def test_hash_directory_builds_the_manifest_and_reports_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    # A safetensors file (the gate judges the bytes): an 8-byte length, the header "{}", data.
    weights = (2).to_bytes(8, "little") + b"{}" + b"\x00" * 2990
    (model / "weights.safetensors").write_bytes(weights)
    (model / "sub" / "vocab.txt").write_text("hello")
    entries = hash_directory(model)
    assert [(e.path, e.size_bytes) for e in entries] == [
        ("sub/vocab.txt", 5),
        ("weights.safetensors", 3000),
    ]
    assert entries[1].sha256 == hashlib.sha256(weights).hexdigest()
    assert "100%" in capsys.readouterr().err


@pytest.mark.parametrize("kind", HOSTILE_KINDS)
def test_hash_directory_gates_before_hashing_anything(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_hostile_artifact(tmp_path / "model", kind)
    with pytest.raises(GantryError) as caught:
        hash_directory(model)
    assert caught.value.reason == BY_KIND[kind].reason
    assert caught.value.metadata["file"] == BY_KIND[kind].offending
    assert "hashing" not in capsys.readouterr().err  # refused before the progress bar started


def test_hash_directory_takes_pickle_only_when_allowed(tmp_path: Path) -> None:
    model = write_hostile_artifact(tmp_path / "model", "pickle-weights")
    paths = [e.path for e in hash_directory(model, allow_pickle=True)]
    assert "pytorch_model.bin" in paths

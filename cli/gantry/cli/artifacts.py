"""Local artifact work: a directory's location under the artifact root, copying, gating, hashing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gantry.cli.errors import CliError
from gantry.cli.progress import ProgressBar
from gantry.common.artifact_walk import build_manifest, gate_directory, total_size
from gantry.common.errors import GantryError
from gantry.common.manifest import check_relative_path
from gantry.v1 import common_pb2


def artifact_location(directory: Path, artifact_root: Path) -> str:
    """The directory relative to the artifact root ('/'-separated); outside the root is refused.

    Workers resolve a location against their own artifact root, so a directory anywhere else could
    never be found (or verified) by them.
    """
    root = artifact_root.resolve()
    target = directory.resolve()
    if not target.is_dir():
        raise CliError(f"{directory} is not a directory")
    if target == root:
        # Copying the root into itself (the other hint) would be wrong advice here.
        raise CliError(
            f"{directory} is the artifact root itself; register one model directory inside it"
            f" (e.g. `gantry artifacts register {artifact_root}/MODEL_NAME`)"
        )
    if target in root.parents:
        raise CliError(
            f"{directory} holds the artifact root {artifact_root}; register one model directory"
            f" inside the root (e.g. `gantry artifacts register {artifact_root}/MODEL_NAME`)"
        )
    if root not in target.parents:
        raise CliError(
            f"{directory} is not under the artifact root {artifact_root}; place the model"
            f" directory there first (e.g. `cp -r {directory} {artifact_root}/`), or pass"
            " --artifact-root when the servers use another root"
        )
    location = target.relative_to(root).as_posix()
    try:
        return check_relative_path(location, what="artifact location")
    except GantryError as exc:
        raise CliError(exc.message) from None


def hash_directory(
    directory: Path, *, label: str = "hashing", allow_pickle: bool = False
) -> list[common_pb2.ManifestEntry]:
    """The manifest of every file under a directory, with a progress bar on stderr.

    The static artifact gate runs first (it reads config files only, so it is quick): a directory
    no worker would load is refused before gigabytes are hashed or anything is registered.
    """
    gate_directory(directory, allow_pickle=allow_pickle)
    bar = ProgressBar(f"{label} {directory.name}", total_size(directory))
    entries = build_manifest(directory, bar.advance)
    bar.finish()
    return [
        common_pb2.ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256)
        for e in entries
    ]


def _link_or_copy(source: str, destination: str) -> str:
    # A hard link costs no space and no time; across filesystems (or where links are refused)
    # fall back to a real copy.
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)
    return destination


def place_copy(source: Path, destination: Path) -> bool:
    """Copy a model directory into the artifact root; False when it is already there.

    The copy is built under a temporary name and renamed into place, so a directory at the
    destination is always complete: an interrupted copy is never hashed and registered.
    """
    if destination.exists():
        return False
    staging = destination.with_name(f".{destination.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        shutil.copytree(source, staging, copy_function=_link_or_copy)
        os.replace(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return True

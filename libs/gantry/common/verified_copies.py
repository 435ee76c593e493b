"""Verification before a load: a private copy of exactly the bytes checked against a manifest.

Verification walks the shared artifact directory without following links (`artifact_walk`),
hashes each file from the descriptor it opened and copies exactly the bytes it hashed into a
private directory (under the process's own root, `verified_roots`), then hands that copy to the
loader: a file swapped in the shared artifact directory after verification can never be the one
loaded.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gantry.common.artifact_gate import ListedEntry, check_contents, check_listing
from gantry.common.artifact_walk import (
    hash_descriptor,
    open_child_directory,
    open_child_file,
    open_directory,
    read_relative,
    walk,
)
from gantry.common.errors import GantryError
from gantry.common.manifest import (
    ManifestEntry,
    check_relative_path,
    manifest_digest,
    path_invalid,
    validate_manifest,
)
from gantry.common.verified_roots import default_verified_root, private_root

VERIFIED_COPY_SUFFIX = ".verified"


@dataclass(frozen=True, slots=True)
class VerifiedArtifact:
    directory: Path  # the private copy to load from (remove with remove_verified_copy)
    files_verified: int
    bytes_verified: int


def _open_location(root_fd: int, location: str) -> int:
    dir_fd = os.dup(root_fd)
    parts = location.split("/")
    try:
        for index, part in enumerate(parts):
            walked = "/".join(parts[: index + 1])
            try:
                listed = os.stat(part, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                raise GantryError(
                    "ARTIFACT_MISMATCH",
                    f"artifact directory {location!r} is missing",
                    location=location,
                ) from None
            if stat.S_ISLNK(listed.st_mode):
                raise path_invalid(
                    f"artifact location {location!r} passes through a symlink at {walked!r}:"
                    " copy the model with `cp -rL SOURCE DEST` so its files are real",
                    location=location,
                    file=walked,
                )
            if not stat.S_ISDIR(listed.st_mode):
                raise GantryError(
                    "ARTIFACT_MISMATCH",
                    f"artifact location {location!r}: {walked!r} is not a directory",
                    location=location,
                )
            child = open_child_directory(dir_fd, part, walked)
            os.close(dir_fd)
            dir_fd = child
        return dir_fd
    except BaseException:
        os.close(dir_fd)
        raise


def _copy_verified(
    location_fd: int, expected: dict[str, ManifestEntry], copy: Path
) -> tuple[list[str], list[ListedEntry], int]:
    """Hash every expected file from its descriptor while copying it into `copy`.

    Returns the differences found, the listing of the source (modes as found there) and the bytes
    verified.
    """
    problems: list[str] = []
    listing: list[ListedEntry] = []
    found_files: set[str] = set()
    verified_bytes = 0
    for found in walk(location_fd):
        listing.append(ListedEntry(found.relative, found.listed.st_mode))
        target = copy / found.relative
        if stat.S_ISDIR(found.listed.st_mode):
            os.mkdir(target, 0o700)
            continue
        found_files.add(found.relative)
        entry = expected.get(found.relative)
        if entry is None:
            continue  # reported as extra below; never read
        if found.listed.st_size != entry.size_bytes:
            problems.append(
                f"size of {entry.path} is {found.listed.st_size}, manifest says {entry.size_bytes}"
            )
            continue
        fd = open_child_file(found.dir_fd, found.name, found.relative, found.listed)
        try:
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
            try:
                sha256, length = hash_descriptor(fd, copy_to=out)
            finally:
                os.close(out)
        finally:
            os.close(fd)
        if length != entry.size_bytes:
            problems.append(f"size of {entry.path} changed while it was read")
        elif sha256 != entry.sha256:
            problems.append(f"sha256 of {entry.path} differs from the manifest")
        verified_bytes += length
    problems[:0] = [f"missing {path}" for path in sorted(expected.keys() - found_files)] + [
        f"extra {path}" for path in sorted(found_files - expected.keys())
    ]
    return problems, listing, verified_bytes


def verify_artifact(
    artifact_root: Path,
    location: str,
    manifest: Sequence[ManifestEntry],
    *,
    verified_root: Path | None = None,
    allow_pickle: bool = False,
) -> VerifiedArtifact:
    """Verify an artifact set and return a private copy of exactly the bytes verified.

    Raises ARTIFACT_PATH_INVALID for a symlink, special file or bad name anywhere under (or on the
    way to) the location, ARTIFACT_MISMATCH naming every missing, extra, resized or changed file,
    and RUNTIME_INCOMPATIBLE when the gate refuses the (matching) contents. The copy lives under
    `verified_root` (default: `default_verified_root()`), one fresh directory per call; the caller
    owns it and removes it with `remove_verified_copy` once no model host uses it.
    """
    location = check_relative_path(location, what="artifact location")
    expected = {entry.path: entry for entry in validate_manifest(manifest)}
    location_fd = _open_artifact_location(artifact_root, location)
    try:
        copy = Path(
            tempfile.mkdtemp(
                prefix=f"{manifest_digest(manifest)[:16]}-",
                suffix=VERIFIED_COPY_SUFFIX,
                dir=private_root(verified_root or default_verified_root()),
            )
        )
        try:
            verified_bytes = _verify_into_copy(
                location_fd, location, expected, copy, allow_pickle=allow_pickle
            )
        except BaseException:
            remove_verified_copy(copy)
            raise
    finally:
        os.close(location_fd)
    return VerifiedArtifact(
        directory=copy, files_verified=len(expected), bytes_verified=verified_bytes
    )


def _open_artifact_location(artifact_root: Path, location: str) -> int:
    """A descriptor of the location's directory, opened from the root without following links."""
    try:
        root_fd = os.open(artifact_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise GantryError(
            "ARTIFACT_MISMATCH", f"artifact root {artifact_root} is missing", location=location
        ) from None
    try:
        return _open_location(root_fd, location)
    finally:
        os.close(root_fd)


def _verify_into_copy(
    location_fd: int,
    location: str,
    expected: dict[str, ManifestEntry],
    copy: Path,
    *,
    allow_pickle: bool,
) -> int:
    """Copy the location into `copy`, refusing any difference from the manifest, then pass the
    gate over what was copied; the bytes verified."""
    problems, listing, verified_bytes = _copy_verified(location_fd, expected, copy)
    if problems:
        raise GantryError(
            "ARTIFACT_MISMATCH",
            f"artifact {location!r} does not match its manifest: " + "; ".join(problems[:10]),
            location=location,
            differences=str(len(problems)),
        )
    # Names and modes as found in the source; contents from the copy: the bytes that load.
    check_listing(listing, allow_pickle=allow_pickle)
    copy_fd = open_directory(copy)
    try:
        check_contents(
            sorted(expected),
            lambda path, limit: read_relative(copy_fd, path, limit),
            allow_pickle=allow_pickle,
        )
    finally:
        os.close(copy_fd)
    return verified_bytes


def remove_verified_copy(directory: Path) -> None:
    """Delete a private copy made by verify_artifact; a copy already gone is fine.

    Anything that is not such a copy (by name) is refused, so a wrong path never deletes an
    artifact set.
    """
    if not directory.name.endswith(VERIFIED_COPY_SUFFIX):
        raise ValueError(f"{directory} is not a verified artifact copy")
    try:
        shutil.rmtree(directory)
    except FileNotFoundError:
        pass

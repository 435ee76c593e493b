"""Artifact manifests: the path rules, hashing a directory, the canonical digest, verification.

One module serves the three places that touch artifact bytes: the CLI hashes a directory to
register it, the control plane validates what it is sent, the worker re-verifies bytes before any
load. Verification never follows a path out of the artifact root.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gantry.common.errors import GantryError

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20

ProgressCallback = Callable[[int], None]  # called with the bytes hashed since the last call


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    path: str
    size_bytes: int
    sha256: str


def path_invalid(message: str, **metadata: str) -> GantryError:
    return GantryError("ARTIFACT_PATH_INVALID", message, **metadata)


def check_relative_path(path: str, *, what: str) -> str:
    """A location or manifest path: relative, '/'-separated, no '..', no empty or '.' parts."""
    if not path:
        raise path_invalid(f"{what} is empty")
    if "\\" in path or "\x00" in path:
        raise path_invalid(f"{what} {path!r} holds a backslash or NUL", path=path)
    pure = PurePosixPath(path)
    if pure.is_absolute() or path.startswith("/"):
        raise path_invalid(f"{what} {path!r} is absolute", path=path)
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise path_invalid(f"{what} {path!r} has an empty, '.' or '..' part", path=path)
    return path


def validate_manifest(entries: Sequence[ManifestEntry]) -> list[ManifestEntry]:
    """Reject what no registration may hold; return the entries sorted by path."""
    if not entries:
        raise path_invalid("the manifest is empty")
    seen: set[str] = set()
    for entry in entries:
        check_relative_path(entry.path, what="manifest path")
        if entry.path in seen:
            raise path_invalid(f"manifest path {entry.path!r} is listed twice", path=entry.path)
        seen.add(entry.path)
        if not _SHA256_HEX.match(entry.sha256):
            raise GantryError(
                "INVALID_ARGUMENT",
                f"sha256 of {entry.path!r} is not 64 lowercase hex digits",
                path=entry.path,
            )
    return sorted(entries, key=lambda e: e.path)


def manifest_digest(entries: Iterable[ManifestEntry]) -> str:
    """sha256 over the canonical form: a `path\\tsize\\tsha256\\n` line per file, by path."""
    digest = hashlib.sha256()
    for entry in sorted(entries, key=lambda e: e.path):
        digest.update(f"{entry.path}\t{entry.size_bytes}\t{entry.sha256}\n".encode())
    return digest.hexdigest()


def sha256_file(path: Path, progress: ProgressCallback | None = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            if progress is not None:
                progress(len(chunk))
    return digest.hexdigest()


def _walk_files(root: Path) -> list[tuple[str, Path]]:
    """Every file under root as (relative posix path, absolute path); links that leave root fail."""
    resolved_root = root.resolve()
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        current = Path(dirpath)
        for name in list(dirnames):
            candidate = current / name
            if candidate.is_symlink():
                _ensure_inside(resolved_root, candidate)
                # A directory link inside the root is walked as a file tree of its own target.
                dirnames.remove(name)
                found.extend(
                    (f"{candidate.relative_to(root).as_posix()}/{rel}", path)
                    for rel, path in _walk_files(candidate)
                )
        for name in filenames:
            candidate = current / name
            if candidate.is_symlink():
                _ensure_inside(resolved_root, candidate)
            mode = os.stat(candidate).st_mode
            if not stat.S_ISREG(mode):
                raise path_invalid(f"{candidate} is not a regular file", path=str(candidate))
            found.append((candidate.relative_to(root).as_posix(), candidate))
    return sorted(found)


def _ensure_inside(resolved_root: Path, candidate: Path) -> None:
    target = candidate.resolve()
    if target != resolved_root and resolved_root not in target.parents:
        raise GantryError(
            "ARTIFACT_MISMATCH",
            f"{candidate} links outside the artifact root (to {target})",
            path=str(candidate),
        )


def total_size(directory: Path) -> int:
    return sum(path.stat().st_size for _, path in _walk_files(directory))


def build_manifest(
    directory: Path, progress: ProgressCallback | None = None
) -> list[ManifestEntry]:
    """Hash every file of a local model directory (the CLI's side of registration)."""
    if not directory.is_dir():
        raise path_invalid(f"{directory} is not a directory", path=str(directory))
    entries = [
        ManifestEntry(path=rel, size_bytes=path.stat().st_size, sha256=sha256_file(path, progress))
        for rel, path in _walk_files(directory)
    ]
    if not entries:
        raise path_invalid(f"{directory} holds no files", path=str(directory))
    return entries


@dataclass(frozen=True, slots=True)
class VerifiedArtifact:
    directory: Path
    files_verified: int
    bytes_verified: int


def resolve_location(artifact_root: Path, location: str) -> Path:
    """The directory of an artifact set under the root; a location that escapes it is refused."""
    check_relative_path(location, what="artifact location")
    root = artifact_root.resolve()
    directory = (root / location).resolve()
    if directory != root and root not in directory.parents:
        raise GantryError(
            "ARTIFACT_MISMATCH", f"location {location!r} resolves outside the artifact root"
        )
    return directory


def verify_artifact(
    artifact_root: Path, location: str, manifest: Sequence[ManifestEntry]
) -> VerifiedArtifact:
    """Compare the bytes on disk with the manifest: missing, extra, resized or changed files fail.

    Raises GantryError(ARTIFACT_MISMATCH) naming every difference found.
    """
    directory = resolve_location(artifact_root, location)
    if not directory.is_dir():
        raise GantryError(
            "ARTIFACT_MISMATCH", f"artifact directory {location!r} is missing", location=location
        )
    expected = {entry.path: entry for entry in validate_manifest(manifest)}
    on_disk = dict(_walk_files(directory))
    problems: list[str] = []
    problems += [f"missing {path}" for path in sorted(expected.keys() - on_disk.keys())]
    problems += [f"extra {path}" for path in sorted(on_disk.keys() - expected.keys())]
    verified_bytes = 0
    for path in sorted(expected.keys() & on_disk.keys()):
        entry, actual = expected[path], on_disk[path]
        size = actual.stat().st_size
        if size != entry.size_bytes:
            problems.append(f"size of {path} is {size}, manifest says {entry.size_bytes}")
        elif sha256_file(actual) != entry.sha256:
            problems.append(f"sha256 of {path} differs from the manifest")
        verified_bytes += size
    if problems:
        raise GantryError(
            "ARTIFACT_MISMATCH",
            f"artifact {location!r} does not match its manifest: " + "; ".join(problems[:10]),
            location=location,
            differences=str(len(problems)),
        )
    return VerifiedArtifact(
        directory=directory, files_verified=len(expected), bytes_verified=verified_bytes
    )

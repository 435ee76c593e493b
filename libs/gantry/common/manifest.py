"""Artifact manifests: the entries, the path rules, validation and the canonical digest.

One definition serves the three places that touch artifact bytes: the CLI hashes (and gates) a
directory to register it (`artifact_walk`), the control plane validates what it is sent, the
worker re-verifies bytes before any load (`verified_copies`). What a manifest may say is decided
here alone, so the three agree on it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gantry.common.artifact_gate import shown, unsafe_character
from gantry.common.errors import GantryError

_SHA256_HEX_DIGITS = frozenset("0123456789abcdef")
MAX_MANIFEST_ENTRIES = 100_000
MAX_PATH_BYTES = 1024
MAX_FILE_BYTES = (1 << 63) - 1  # the database stores sizes as signed 64-bit integers
# Version of the canonical encoding that `manifest_digest` hashes. v1 (before this module
# versioned it) joined `path\tsize\tsha256\n` lines and was not injective; rows registered under
# v1 keep the digest they were stored with (it is an opaque identity afterwards: nothing
# recomputes it), every new registration gets a v2 digest.
MANIFEST_DIGEST_VERSION = 2


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    path: str
    size_bytes: int
    sha256: str


def path_invalid(message: str, **metadata: str) -> GantryError:
    return GantryError("ARTIFACT_PATH_INVALID", message, **metadata)


def check_relative_path(path: str, *, what: str) -> str:
    """A location or manifest path: relative, '/'-separated, printable, bounded, no '..'."""
    if not path:
        raise path_invalid(f"{what} is empty", field=what)
    unsafe = unsafe_character(path)
    if unsafe is not None:
        raise path_invalid(f"{what} {path!r} holds a {unsafe}", field=what, path=shown(path))
    if len(path.encode("utf-8")) > MAX_PATH_BYTES:
        raise path_invalid(
            f"{what} {shown(path[:64])!r}... is longer than {MAX_PATH_BYTES} bytes",
            field=what,
            limit=str(MAX_PATH_BYTES),
        )
    if path.startswith("/"):
        raise path_invalid(f"{what} {path!r} is absolute", field=what, path=path)
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise path_invalid(f"{what} {path!r} has an empty, '.' or '..' part", field=what, path=path)
    return path


def validate_manifest(entries: Sequence[ManifestEntry]) -> list[ManifestEntry]:
    """Reject what no registration may hold; return the entries sorted by path."""
    if not entries:
        raise path_invalid("the manifest is empty", field="manifest")
    if len(entries) > MAX_MANIFEST_ENTRIES:
        raise GantryError(
            "INVALID_ARGUMENT",
            f"the manifest lists {len(entries)} files; the limit is {MAX_MANIFEST_ENTRIES}",
            field="manifest",
            limit=str(MAX_MANIFEST_ENTRIES),
        )
    seen: set[str] = set()
    directories: set[str] = set()
    for entry in entries:
        check_relative_path(entry.path, what="manifest path")
        if entry.path in seen:
            raise path_invalid(
                f"manifest path {entry.path!r} is listed twice", field="manifest", path=entry.path
            )
        seen.add(entry.path)
        parts = entry.path.split("/")
        directories.update("/".join(parts[:depth]) for depth in range(1, len(parts)))
        if not 0 <= entry.size_bytes <= MAX_FILE_BYTES:
            raise GantryError(
                "INVALID_ARGUMENT",
                f"size_bytes of {entry.path!r} is outside 0..{MAX_FILE_BYTES}",
                field="manifest.size_bytes",
                path=entry.path,
            )
        if len(entry.sha256) != 64 or not _SHA256_HEX_DIGITS.issuperset(entry.sha256):
            raise GantryError(
                "INVALID_ARGUMENT",
                f"sha256 of {entry.path!r} is not 64 lowercase hex digits",
                field="manifest.sha256",
                path=entry.path,
            )
    # A path cannot be a file and a directory at once: such a manifest matches no directory.
    clash = min(seen & directories, default=None)
    if clash is not None:
        raise path_invalid(
            f"manifest path {clash!r} is listed as a file and as a directory",
            field="manifest",
            path=clash,
        )
    return sorted(entries, key=lambda e: e.path)


def canonical_manifest(entries: Iterable[ManifestEntry]) -> bytes:
    """The versioned, injective encoding: JSON (strings escaped, so no separator can be forged)."""
    files = sorted((e.path, e.size_bytes, e.sha256) for e in entries)
    document = {"version": MANIFEST_DIGEST_VERSION, "files": [list(f) for f in files]}
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def manifest_digest(entries: Iterable[ManifestEntry]) -> str:
    """sha256 (64 lowercase hex digits) of `canonical_manifest`; see MANIFEST_DIGEST_VERSION."""
    return hashlib.sha256(canonical_manifest(entries)).hexdigest()

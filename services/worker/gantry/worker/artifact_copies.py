"""Verified private copies of artifact sets for the worker's jobs (LOAD, INSPECT, PROBE).

Every job that reads model bytes reads them from a copy `verify_artifact` made of exactly the
bytes it hashed against the manifest. Copies are never shared: a LOAD's copy belongs to its
resident until custody ends (supervision removes it), an INSPECT's or a PROBE's to the job, which
removes it before it reports. Hashing runs in a thread (gigabytes must not stall the stream); a
job cancelled meanwhile waits the thread out and removes the copy it made.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from gantry.common.errors import GantryError
from gantry.common.manifest import ManifestEntry
from gantry.common.verified_copies import VerifiedArtifact, remove_verified_copy, verify_artifact
from gantry.v1 import common_pb2

log = logging.getLogger(__name__)

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def manifest_of(entries: Iterable[common_pb2.ManifestEntry]) -> list[ManifestEntry]:
    return [ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256) for e in entries]


async def verified_copy(
    artifact_root: Path,
    location: str,
    manifest: list[ManifestEntry],
    *,
    allow_pickle: bool,
    verified_root: Path | None = None,
) -> VerifiedArtifact:
    """`verify_artifact` in a thread; the caller owns the copy (see `discard_copy`)."""
    hashing = asyncio.ensure_future(
        asyncio.to_thread(
            verify_artifact,
            artifact_root,
            location,
            manifest,
            allow_pickle=allow_pickle,
            verified_root=verified_root,
        )
    )
    try:
        return await asyncio.shield(hashing)
    except asyncio.CancelledError:
        # The thread cannot be interrupted: let it finish, then drop what it made.
        with contextlib.suppress(Exception):
            discard_copy((await hashing).directory)
        raise


def discard_copy(directory: Path) -> None:
    try:
        remove_verified_copy(directory)
    except (OSError, ValueError) as error:
        log.warning("could not remove the verified copy %s: %s", directory, error)


def read_no_follow(top: Path, relative: str, limit: int) -> bytes:
    """Up to `limit` bytes of `top/relative`, no component followed as a symlink."""
    parts = [part for part in relative.split("/") if part]
    if not parts or any(part in (".", "..") for part in parts):
        raise GantryError("ARTIFACT_PATH_INVALID", f"{relative!r} is not a relative file path")
    dir_fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            child = os.open(part, _DIRECTORY_FLAGS, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = child
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise GantryError(
                    "ARTIFACT_PATH_INVALID", f"{relative!r} is a symlink", file=relative
                ) from None
            raise
    finally:
        os.close(dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GantryError(
                "ARTIFACT_PATH_INVALID", f"{relative!r} is not a regular file", file=relative
            )
        chunks: list[bytes] = []
        remaining = limit
        while remaining > 0 and (chunk := os.read(fd, min(remaining, 1 << 20))):
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def reader_of_copy(copy: Path) -> Callable[[str, int], bytes]:
    return lambda path, limit: read_no_follow(copy, path, limit)


def reader_of_source(
    artifact_root: Path, location: str, manifest: list[ManifestEntry]
) -> Callable[[str, int], bytes]:
    """Reads straight from the registered location, for an inspection the gate refused a copy
    of (the bytes matched the manifest before the gate ran). Each file read whole is checked
    against its manifest sha256 again; a head read of a larger file cannot be, and serves only
    the report (nothing is loaded from it)."""
    expected = {entry.path: entry for entry in manifest}

    def read(path: str, limit: int) -> bytes:
        entry = expected.get(path)
        if entry is None:
            raise GantryError("ARTIFACT_MISMATCH", f"{path!r} is not in the manifest", file=path)
        # The location's components are walked without following links too.
        data = read_no_follow(artifact_root, f"{location}/{path}", limit)
        if entry.size_bytes <= limit and (
            len(data) != entry.size_bytes or hashlib.sha256(data).hexdigest() != entry.sha256
        ):
            raise GantryError(
                "ARTIFACT_MISMATCH", f"{path!r} changed after it was verified", file=path
            )
        return data

    return read

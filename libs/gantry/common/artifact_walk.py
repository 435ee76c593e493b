"""Walking an artifact directory without following links, and what the CLI does with one.

Every walk is made of `O_NOFOLLOW` opens relative to directory descriptors and hashes from the
descriptor it opened, so no symlink is ever followed inside an artifact set and the bytes hashed
are the bytes of the entry that was checked. The CLI's side of registration (`build_manifest`,
`gate_directory`, `total_size`) reads a local directory through it; verification
(`verified_copies`) walks the shared artifact directory with the same opens.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gantry.common.artifact_gate import ListedEntry, check_entry_kind, gate_artifact, shown
from gantry.common.errors import GantryError
from gantry.common.manifest import (
    MAX_MANIFEST_ENTRIES,
    MAX_PATH_BYTES,
    ManifestEntry,
    path_invalid,
)

_CHUNK = 1 << 20
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a fifo that raced in after the lstat must not hang the walk.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

ProgressCallback = Callable[[int], None]  # called with the bytes hashed since the last call


def open_directory(directory: Path) -> int:
    """The top of a walk. The directory itself is the caller's choice and may be reached by link."""
    try:
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise path_invalid(f"{directory} is not a directory", path=str(directory)) from None


def open_child_directory(dir_fd: int, name: str, relative: str) -> int:
    try:
        return os.open(name, _DIRECTORY_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise path_invalid(
                f"{relative!r} is a symlink (or was replaced by one)", file=shown(relative)
            ) from None
        raise


def open_child_file(dir_fd: int, name: str, relative: str, listed: os.stat_result) -> int:
    """Open a listed file; it must still be the same regular file (no swap since the lstat)."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise path_invalid(f"{relative!r} is a symlink", file=shown(relative)) from None
        if exc.errno == errno.ENOENT:
            raise GantryError(
                "ARTIFACT_MISMATCH",
                f"{relative!r} disappeared while being read",
                file=shown(relative),
            ) from None
        raise
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (
        listed.st_dev,
        listed.st_ino,
    ):
        os.close(fd)
        raise GantryError(
            "ARTIFACT_MISMATCH", f"{relative!r} was replaced while being read", file=shown(relative)
        )
    return fd


@dataclass(frozen=True, slots=True)
class _Found:
    relative: str
    name: str
    dir_fd: int  # open while the walk is paused at this entry
    listed: os.stat_result


def walk(top_fd: int) -> Iterator[_Found]:
    """Every entry under top_fd, parents before children; only plain files and directories.

    A symlink, a special file or a name with a control character is refused where it is met.
    """
    pending: list[tuple[str, int]] = [("", os.dup(top_fd))]
    count = 0
    try:
        while pending:
            prefix, dir_fd = pending.pop()
            try:
                for name in sorted(os.listdir(dir_fd)):
                    relative = prefix + name
                    try:
                        listed = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    except FileNotFoundError:
                        raise GantryError(
                            "ARTIFACT_MISMATCH",
                            f"{relative!r} disappeared while being read",
                            file=shown(relative),
                        ) from None
                    count += 1
                    if count > 2 * MAX_MANIFEST_ENTRIES:  # files and their directories
                        raise GantryError(
                            "INVALID_ARGUMENT",
                            f"more than {MAX_MANIFEST_ENTRIES} files; too many to register",
                            limit=str(MAX_MANIFEST_ENTRIES),
                        )
                    check_entry_kind(ListedEntry(relative, listed.st_mode))
                    if len(relative.encode("utf-8")) > MAX_PATH_BYTES:
                        raise path_invalid(
                            f"{relative[:64]!r}... is longer than {MAX_PATH_BYTES} bytes",
                            limit=str(MAX_PATH_BYTES),
                        )
                    yield _Found(relative, name, dir_fd, listed)
                    if stat.S_ISDIR(listed.st_mode):
                        child = open_child_directory(dir_fd, name, relative)
                        pending.append((relative + "/", child))
            finally:
                os.close(dir_fd)
    finally:
        for _, fd in pending:
            os.close(fd)


def hash_descriptor(
    fd: int, *, progress: ProgressCallback | None = None, copy_to: int | None = None
) -> tuple[str, int]:
    """sha256 and length of what fd yields; the same bytes go to copy_to when given."""
    digest = hashlib.sha256()
    length = 0
    while chunk := os.read(fd, _CHUNK):
        digest.update(chunk)
        length += len(chunk)
        if copy_to is not None:
            view = memoryview(chunk)
            while view:
                view = view[os.write(copy_to, view) :]
        if progress is not None:
            progress(len(chunk))
    return digest.hexdigest(), length


def read_relative(top_fd: int, path: str, limit: int) -> bytes:
    """Up to `limit` bytes of a file under top_fd, every component opened without following."""
    *parents, name = path.split("/")
    dir_fd = os.dup(top_fd)
    try:
        for index, part in enumerate(parents):
            child = open_child_directory(dir_fd, part, "/".join(parents[: index + 1]))
            os.close(dir_fd)
            dir_fd = child
        listed = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        fd = open_child_file(dir_fd, name, path, listed)
    finally:
        os.close(dir_fd)
    try:
        parts: list[bytes] = []
        remaining = limit
        while remaining > 0 and (chunk := os.read(fd, min(remaining, _CHUNK))):
            parts.append(chunk)
            remaining -= len(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def _listing(top_fd: int) -> list[ListedEntry]:
    return [ListedEntry(found.relative, found.listed.st_mode) for found in walk(top_fd)]


def total_size(directory: Path) -> int:
    top_fd = open_directory(directory)
    try:
        return sum(f.listed.st_size for f in walk(top_fd) if stat.S_ISREG(f.listed.st_mode))
    finally:
        os.close(top_fd)


def build_manifest(
    directory: Path, progress: ProgressCallback | None = None
) -> list[ManifestEntry]:
    """Hash every file of a local model directory (the CLI's side of registration).

    Symlinks, special files and unprintable names are refused (ARTIFACT_PATH_INVALID); the
    content rules are `gate_directory`'s.
    """
    top_fd = open_directory(directory)
    entries: list[ManifestEntry] = []
    try:
        for found in walk(top_fd):
            if not stat.S_ISREG(found.listed.st_mode):
                continue
            fd = open_child_file(found.dir_fd, found.name, found.relative, found.listed)
            try:
                sha256, size = hash_descriptor(fd, progress=progress)
            finally:
                os.close(fd)
            entries.append(ManifestEntry(path=found.relative, size_bytes=size, sha256=sha256))
    finally:
        os.close(top_fd)
    if not entries:
        raise path_invalid(f"{directory} holds no files", path=str(directory))
    return sorted(entries, key=lambda e: e.path)


def gate_directory(directory: Path, *, allow_pickle: bool = False) -> None:
    """Run the static artifact gate over a directory (see gantry.common.artifact_gate)."""
    top_fd = open_directory(directory)
    try:
        gate_artifact(
            _listing(top_fd),
            lambda path, limit: read_relative(top_fd, path, limit),
            allow_pickle=allow_pickle,
        )
    finally:
        os.close(top_fd)

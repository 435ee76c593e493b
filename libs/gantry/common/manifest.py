"""Artifact manifests: the path rules, hashing a directory, the canonical digest, verification.

One module serves the three places that touch artifact bytes: the CLI hashes (and gates) a
directory to register it, the control plane validates what it is sent, the worker re-verifies bytes
before any load. Every walk is made of `O_NOFOLLOW` opens relative to directory descriptors and
hashes from the descriptor it opened, so no symlink is ever followed inside an artifact set and the
bytes hashed are the bytes of the entry that was checked. Verification copies exactly the bytes it
hashed into a private directory and hands that copy to the loader: a file swapped in the shared
artifact directory after verification can never be the one loaded. Each process keeps its copies
in a directory of its own, locked for as long as it lives, so copies a killed process leaves
behind are found and reclaimed by the next one (`sweep_abandoned_verified_roots`).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gantry.common.artifact_gate import (
    ListedEntry,
    check_contents,
    check_entry_kind,
    check_listing,
    gate_artifact,
    shown,
    unsafe_character,
)
from gantry.common.errors import GantryError

_CHUNK = 1 << 20
_SHA256_HEX_DIGITS = frozenset("0123456789abcdef")
MAX_MANIFEST_ENTRIES = 100_000
MAX_PATH_BYTES = 1024
MAX_FILE_BYTES = (1 << 63) - 1  # the database stores sizes as signed 64-bit integers
# Version of the canonical encoding that `manifest_digest` hashes. v1 (before this module
# versioned it) joined `path\tsize\tsha256\n` lines and was not injective; rows registered under
# v1 keep the digest they were stored with (it is an opaque identity afterwards: nothing
# recomputes it), every new registration gets a v2 digest.
MANIFEST_DIGEST_VERSION = 2
VERIFIED_COPY_SUFFIX = ".verified"
# One directory per process under the per-user base; its owner holds an exclusive flock on the
# lock file inside for as long as it lives.
VERIFIED_ROOT_SUFFIX = ".owner"
VERIFIED_ROOT_LOCK = "owner.lock"
_CLAIMING_SUFFIX = ".claiming"

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a fifo that raced in after the lstat must not hang the walk.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

ProgressCallback = Callable[[int], None]  # called with the bytes hashed since the last call


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


# --- walking a directory without following links -----------------------------------------------


def _open_directory(directory: Path) -> int:
    """The top of a walk. The directory itself is the caller's choice and may be reached by link."""
    try:
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise path_invalid(f"{directory} is not a directory", path=str(directory)) from None


def _open_child_directory(dir_fd: int, name: str, relative: str) -> int:
    try:
        return os.open(name, _DIRECTORY_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise path_invalid(
                f"{relative!r} is a symlink (or was replaced by one)", file=shown(relative)
            ) from None
        raise


def _open_child_file(dir_fd: int, name: str, relative: str, listed: os.stat_result) -> int:
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


def _walk(top_fd: int) -> Iterator[_Found]:
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
                        child = _open_child_directory(dir_fd, name, relative)
                        pending.append((relative + "/", child))
            finally:
                os.close(dir_fd)
    finally:
        for _, fd in pending:
            os.close(fd)


def _hash_descriptor(
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


def _read_relative(top_fd: int, path: str, limit: int) -> bytes:
    """Up to `limit` bytes of a file under top_fd, every component opened without following."""
    *parents, name = path.split("/")
    dir_fd = os.dup(top_fd)
    try:
        for index, part in enumerate(parents):
            child = _open_child_directory(dir_fd, part, "/".join(parents[: index + 1]))
            os.close(dir_fd)
            dir_fd = child
        listed = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        fd = _open_child_file(dir_fd, name, path, listed)
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
    return [ListedEntry(found.relative, found.listed.st_mode) for found in _walk(top_fd)]


def total_size(directory: Path) -> int:
    top_fd = _open_directory(directory)
    try:
        return sum(f.listed.st_size for f in _walk(top_fd) if stat.S_ISREG(f.listed.st_mode))
    finally:
        os.close(top_fd)


def build_manifest(
    directory: Path, progress: ProgressCallback | None = None
) -> list[ManifestEntry]:
    """Hash every file of a local model directory (the CLI's side of registration).

    Symlinks, special files and unprintable names are refused (ARTIFACT_PATH_INVALID); the
    content rules are `gate_directory`'s.
    """
    top_fd = _open_directory(directory)
    entries: list[ManifestEntry] = []
    try:
        for found in _walk(top_fd):
            if not stat.S_ISREG(found.listed.st_mode):
                continue
            fd = _open_child_file(found.dir_fd, found.name, found.relative, found.listed)
            try:
                sha256, size = _hash_descriptor(fd, progress=progress)
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
    top_fd = _open_directory(directory)
    try:
        gate_artifact(
            _listing(top_fd),
            lambda path, limit: _read_relative(top_fd, path, limit),
            allow_pickle=allow_pickle,
        )
    finally:
        os.close(top_fd)


# --- verification before a load -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VerifiedArtifact:
    directory: Path  # the private copy to load from (remove with remove_verified_copy)
    files_verified: int
    bytes_verified: int


def verified_copies_base() -> Path:
    """Where every process of this user keeps its own directory of verified copies."""
    return Path(tempfile.gettempdir()) / f"gantry-verified-{os.getuid()}"


def default_verified_root() -> Path:
    """This process's own directory of verified copies under `verified_copies_base()`."""
    return claim_verified_root(verified_copies_base())


def _private_root(verified_root: Path) -> Path:
    """The directory holding verified copies: ours, not a link, writable by nobody else."""
    try:
        os.mkdir(verified_root, 0o700)
    except FileExistsError:
        pass
    listed = os.lstat(verified_root)
    if (
        not stat.S_ISDIR(listed.st_mode)
        or listed.st_uid != os.getuid()
        or listed.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise GantryError(
            "INTERNAL",
            f"{verified_root} is not a private directory (a directory owned by uid {os.getuid()},"
            " writable by nobody else); cannot keep verified artifact copies there",
            path=str(verified_root),
        )
    return verified_root


@dataclass(frozen=True, slots=True)
class _Claim:
    pid: int
    directory: Path
    lock_fd: int


_claims: dict[Path, _Claim] = {}
_claims_lock = threading.Lock()


def claim_verified_root(base: Path) -> Path:
    """This process's directory under `base`, created and locked at the first call.

    The lock file is created and locked under a name the sweep ignores, then the directory is
    renamed into view: a sweep never sees an owner directory whose lock is not yet held. A forked
    child claims its own. The lock goes with the process (SIGKILL included); a directory left
    empty is removed at a clean exit.
    """
    with _claims_lock:
        claim = _claims.get(base)
        if claim is not None and claim.pid == os.getpid():
            return claim.directory
        pid = os.getpid()
        staging = Path(
            tempfile.mkdtemp(prefix=f"{pid}-", suffix=_CLAIMING_SUFFIX, dir=_private_root(base))
        )
        lock_fd = os.open(
            staging / VERIFIED_ROOT_LOCK,
            os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            directory = staging.with_name(
                staging.name.removesuffix(_CLAIMING_SUFFIX) + VERIFIED_ROOT_SUFFIX
            )
            os.rename(staging, directory)
        except BaseException:
            os.close(lock_fd)
            shutil.rmtree(staging, ignore_errors=True)
            raise
        claim = _Claim(pid=pid, directory=directory, lock_fd=lock_fd)
        _claims[base] = claim
        atexit.register(_release_if_empty, claim)
        return directory


def _release_if_empty(claim: _Claim) -> None:
    if claim.pid != os.getpid():
        return
    try:
        if os.listdir(claim.directory) == [VERIFIED_ROOT_LOCK]:
            os.unlink(claim.directory / VERIFIED_ROOT_LOCK)
            os.rmdir(claim.directory)
    except OSError:
        pass  # what is left is swept once the lock is gone with this process


@dataclass(frozen=True, slots=True)
class VerifiedSweep:
    directories_removed: int
    bytes_removed: int
    directories_kept: int  # their owners are alive
    failures: tuple[str, ...] = ()  # directories that could not be examined or removed, and why


def _tree_bytes(directory: Path) -> int:
    total = 0
    for parent, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


def _reclaim_if_abandoned(directory: Path) -> int | None:
    """The bytes removed with `directory` when its owner is gone; None while the owner lives.

    Raises FileNotFoundError when another sweep removed it first.
    """
    lock_fd = os.open(directory / VERIFIED_ROOT_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        # Held while deleting: a second sweep waiting on this lock file finds nothing left.
        size = _tree_bytes(directory)
        shutil.rmtree(directory)
        return size
    finally:
        os.close(lock_fd)


def sweep_abandoned_verified_roots(base: Path | None = None) -> VerifiedSweep:
    """Remove every process directory under `base` whose owner is gone, with its copies.

    An owner holds the lock on its directory's lock file until it dies, however it dies; a lock
    this sweep can take therefore belongs to nobody (a pid check could be fooled by pid reuse).
    Symlinks, other users' entries and anything not named as an owner directory are left alone.
    """
    base = _private_root(base or verified_copies_base())
    removed = kept = removed_bytes = 0
    failures: list[str] = []
    for entry in os.scandir(base):
        if not entry.name.endswith(VERIFIED_ROOT_SUFFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            reclaimed = _reclaim_if_abandoned(Path(entry.path))
        except FileNotFoundError:
            continue  # another sweep got there first
        except OSError as exc:
            failures.append(f"{entry.path}: {exc}")
            continue
        if reclaimed is None:
            kept += 1
        else:
            removed += 1
            removed_bytes += reclaimed
    return VerifiedSweep(
        directories_removed=removed,
        bytes_removed=removed_bytes,
        directories_kept=kept,
        failures=tuple(failures),
    )


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
            child = _open_child_directory(dir_fd, part, walked)
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
    for found in _walk(location_fd):
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
        fd = _open_child_file(found.dir_fd, found.name, found.relative, found.listed)
        try:
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
            try:
                sha256, length = _hash_descriptor(fd, copy_to=out)
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
                dir=_private_root(verified_root or default_verified_root()),
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
    copy_fd = _open_directory(copy)
    try:
        check_contents(
            sorted(expected),
            lambda path, limit: _read_relative(copy_fd, path, limit),
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

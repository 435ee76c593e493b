"""Where verified copies live: one private directory per process, and the sweep of the dead's.

Each process keeps its copies in a directory of its own, locked for as long as it lives, so
copies a killed process leaves behind are found and reclaimed by the next one
(`sweep_abandoned_verified_roots`). The copies themselves are `verified_copies`'.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from gantry.common.errors import GantryError

# One directory per process under the per-user base; its owner holds an exclusive flock on the
# lock file inside for as long as it lives.
VERIFIED_ROOT_SUFFIX = ".owner"
VERIFIED_ROOT_LOCK = "owner.lock"
_CLAIMING_SUFFIX = ".claiming"


def verified_copies_base() -> Path:
    """Where every process of this user keeps its own directory of verified copies."""
    return Path(tempfile.gettempdir()) / f"gantry-verified-{os.getuid()}"


def default_verified_root() -> Path:
    """This process's own directory of verified copies under `verified_copies_base()`."""
    return claim_verified_root(verified_copies_base())


def private_root(verified_root: Path) -> Path:
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
            tempfile.mkdtemp(prefix=f"{pid}-", suffix=_CLAIMING_SUFFIX, dir=private_root(base))
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
    base = private_root(base or verified_copies_base())
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

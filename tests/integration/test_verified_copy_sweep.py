"""Verified copies live in a locked directory per process; a sweep reclaims the dead ones' only.

Owners are real child processes: one is SIGKILLed the way an OOM-killed worker dies, one holds its
lock until the test lets it exit.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gantry.common import verified_roots
from gantry.common.errors import GantryError
from gantry.common.verified_roots import (
    VERIFIED_ROOT_LOCK,
    claim_verified_root,
    default_verified_root,
    sweep_abandoned_verified_roots,
)

COPY_BYTES = 3000

# Claims a directory under argv[1], puts a verified copy in it, says where, then dies or waits.
_OWNER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from gantry.common.verified_roots import claim_verified_root
    root = claim_verified_root(Path(sys.argv[1]))
    if sys.argv[2] != "empty":
        copy = root / "0123456789abcdef-x.verified"
        copy.mkdir(mode=0o700)
        (copy / "weights.safetensors").write_bytes(b"w" * 2000)
        (copy / "sub").mkdir(mode=0o700)
        (copy / "sub" / "config.json").write_bytes(b"c" * 1000)
        os.chmod(copy / "weights.safetensors", 0o400)
    print(root, flush=True)
    if sys.argv[2] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.read()  # holds the lock until the test closes stdin
    """
)


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return tmp_path / "gantry-verified"


def _start_owner(base: Path, how: str) -> tuple[subprocess.Popen[str], Path]:
    owner = subprocess.Popen(
        [sys.executable, "-I", "-c", _OWNER, str(base), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    root = Path(owner.stdout.readline().strip())  # written once the lock is held
    assert root.parent == base, root
    return owner, root


@pytest.fixture
def live_owner(base: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    owner, root = _start_owner(base, "waits")
    yield owner, root
    if owner.poll() is None:
        owner.kill()
        owner.wait(timeout=30)


def test_a_sigkilled_workers_directory_is_swept_with_its_copies(base: Path) -> None:
    owner, root = _start_owner(base, "killed")
    assert owner.wait(timeout=30) == -signal.SIGKILL
    assert (root / VERIFIED_ROOT_LOCK).exists()

    sweep = sweep_abandoned_verified_roots(base)

    assert (sweep.directories_removed, sweep.directories_kept) == (1, 0)
    # The copies' bytes, not counting the (empty) lock file.
    assert sweep.bytes_removed == COPY_BYTES
    assert sweep.failures == ()
    assert not root.exists()
    assert list(base.iterdir()) == []


def test_a_directory_whose_owner_holds_its_lock_is_kept_until_the_owner_exits(
    base: Path, live_owner: tuple[subprocess.Popen[str], Path]
) -> None:
    owner, root = live_owner

    sweep = sweep_abandoned_verified_roots(base)

    assert (sweep.directories_removed, sweep.directories_kept) == (0, 1)
    assert (root / "0123456789abcdef-x.verified" / "weights.safetensors").exists()

    # A clean exit that still had copies leaves them to the next sweep.
    assert owner.stdin is not None
    owner.stdin.close()
    assert owner.wait(timeout=30) == 0
    assert root.exists()
    sweep = sweep_abandoned_verified_roots(base)
    assert (sweep.directories_removed, sweep.bytes_removed) == (1, COPY_BYTES)
    assert not root.exists()


def test_a_cleanly_exiting_owner_with_nothing_left_removes_its_own_directory(base: Path) -> None:
    owner, root = _start_owner(base, "empty")
    assert owner.stdin is not None
    owner.stdin.close()
    assert owner.wait(timeout=30) == 0
    assert not root.exists()


def test_this_processs_own_directory_is_never_swept(base: Path) -> None:
    root = claim_verified_root(base)
    assert claim_verified_root(base) == root  # one directory per process

    sweep = sweep_abandoned_verified_roots(base)

    assert (sweep.directories_removed, sweep.directories_kept) == (0, 1)
    assert root.is_dir()


def test_the_default_root_is_this_processs_private_locked_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verified_roots, "verified_copies_base", lambda: tmp_path / "default")

    root = default_verified_root()

    assert root.parent == tmp_path / "default"
    assert root.name.startswith(f"{os.getpid()}-") and root.name.endswith(".owner")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "default").stat().st_mode) == 0o700
    assert (root / VERIFIED_ROOT_LOCK).is_file()


def test_symlinks_unfinished_claims_and_other_names_are_left_alone(
    base: Path, tmp_path: Path
) -> None:
    # An abandoned owner directory outside the base, reachable only through a symlink in it.
    owner, elsewhere = _start_owner(tmp_path / "elsewhere", "killed")
    owner.wait(timeout=30)
    base.mkdir(mode=0o700)
    os.symlink(elsewhere, base / "linked.owner")
    unfinished = base / "4242-abc.claiming"
    unfinished.mkdir()
    (unfinished / VERIFIED_ROOT_LOCK).touch()
    legacy = base / "0123456789abcdef-y.verified"
    legacy.mkdir()
    (base / "file.owner").touch()

    sweep = sweep_abandoned_verified_roots(base)

    assert (sweep.directories_removed, sweep.directories_kept, sweep.failures) == (0, 0, ())
    assert elsewhere.is_dir() and unfinished.is_dir() and legacy.is_dir()
    assert sorted(path.name for path in base.iterdir()) == sorted(
        ["linked.owner", "4242-abc.claiming", "0123456789abcdef-y.verified", "file.owner"]
    )


@pytest.mark.parametrize("kind", ["symlink", "shared"])
def test_a_base_that_is_a_symlink_or_writable_by_others_is_refused(
    tmp_path: Path, kind: str
) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    if kind == "symlink":
        base = tmp_path / "linked-base"
        os.symlink(target, base)
    else:
        base = target
        os.chmod(base, 0o777)
    with pytest.raises(GantryError, match="not a private directory"):
        sweep_abandoned_verified_roots(base)
    with pytest.raises(GantryError, match="not a private directory"):
        claim_verified_root(base)

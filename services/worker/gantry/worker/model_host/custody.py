"""What the worker keeps of a child process in its custody, whichever kind it is: a model host
(`process.ModelHost`) or a managed server (`managed_server.server_process.ManagedServer`).

Both give the child a private directory and an allow-listed environment, answer whether it still
serves, and claim its end only as observed. Invariants: the private directory is removed only
once the child is reaped (a child still running may be writing there); a child counts as gone
only once reaped and its pid no longer names it (nor, for a server, anything of its group).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Generic, Protocol, TypeVar

from gantry.common.errors import GantryError
from gantry.v1 import worker_gateway_pb2
from gantry.worker.model_host.environments import host_environment
from gantry.worker.model_host.exit_status import describe_returncode, exit_evidence
from gantry.worker.model_host.proc_facts import process_identity, rss_bytes_of


class ChildProcess(Protocol):
    """What custody reads of a child process (a `HostProcess`, an asyncio subprocess)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...


Child = TypeVar("Child", bound=ChildProcess)

# The attribute a cancelled start's CancelledError carries its child's exit in (`_note_cancelled`).
_CANCELLED_CHILD = "gantry_cancelled_child"


def cancelled_child(cancelled: BaseException) -> GantryError | None:
    """The child a cancelled start had spawned, as its custody noted it on the CancelledError
    (`pid`, `reaped`, as a failed start's error says them); None: no child was spawned."""
    child = getattr(cancelled, _CANCELLED_CHILD, None)
    return child if isinstance(child, GantryError) else None


def with_child_exit(error: GantryError, *, pid: int, gone: bool) -> GantryError:
    """`error`, naming the child `pid` of a failed start and whether it is gone (`reaped`)."""
    error.metadata["pid"] = str(pid)
    error.metadata["reaped"] = "true" if gone else "false"
    return error


def note_cancelled_child(
    cancelled: BaseException, *, child_kind: str, deployment_id: str, pid: int, gone: bool
) -> None:
    """On a cancelled start's CancelledError, the child it had spawned (`cancelled_child` reads
    it); any other exception is left as it is."""
    if isinstance(cancelled, asyncio.CancelledError):
        stopped = GantryError(
            "LOAD_FAILED",
            f"the start of {child_kind} {deployment_id!r} was cancelled",
            deployment_id=deployment_id,
        )
        setattr(cancelled, _CANCELLED_CHILD, with_child_exit(stopped, pid=pid, gone=gone))


def private_workspace(
    worker_environment: Mapping[str, str], *, prefix: str, test_hooks: bool = False
) -> tuple[Path, dict[str, str]]:
    """A child's private directory and its complete environment (`host_environment`, with the
    test hooks on only for `test_hooks`), which points HOME and TMPDIR there. The caller removes
    the directory if the child never starts."""
    # A fresh 0700 directory per child: its cwd, HOME and scratch, the only place it may write.
    private_dir = Path(tempfile.mkdtemp(prefix=prefix))
    scratch_dir = private_dir / "tmp"
    scratch_dir.mkdir(mode=0o700)
    environment = host_environment(
        worker_environment,
        private_dir=private_dir,
        scratch_dir=scratch_dir,
        test_hooks=test_hooks,
    )
    return private_dir, environment


class ChildCustody(Generic[Child]):
    """The state both kinds keep of their child, and the answers that read only that state."""

    # How messages and logs name the child: "model host", "managed server".
    child_kind: ClassVar[str]
    _log: ClassVar[logging.Logger]

    def __init__(self, *, process: Child, private_dir: Path | None) -> None:
        self._process = process
        self._private_dir = private_dir
        self._started = process_identity(process.pid)
        self._stopping = False
        self._unresponsive: GantryError | None = None
        self._evidence: worker_gateway_pb2.UnloadEvidence | None = None

    @property
    def deployment_id(self) -> str:
        raise NotImplementedError

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return (
            self._process.returncode is None and not self._stopping and self._unresponsive is None
        )

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    @property
    def unresponsive(self) -> GantryError | None:
        return self._unresponsive

    def rss_bytes(self) -> int:
        """Current RSS of the child; 0 only when the process is gone (or /proc is unreadable)."""
        if self._process.returncode is not None:
            return 0
        return rss_bytes_of(self.pid) or 0

    def _exit_error(self) -> GantryError:
        """RUNTIME_CRASHED for the child that exited, with the tail of its output."""
        raise NotImplementedError

    def _check_serving(self) -> None:
        if self._unresponsive is not None:
            raise self._unresponsive
        if self._stopping:
            raise GantryError(
                "DEPLOYMENT_NOT_READY",
                f"{self.child_kind} {self.deployment_id!r} is stopping",
                deployment_id=self.deployment_id,
            )
        if self._process.returncode is not None:
            raise self._exit_error()

    def _leftover_alive(self) -> bool:
        """Whether something the child started outlives it; a model host leaves nothing."""
        return False

    def _confirmed_gone(self) -> bool:
        if self._process.returncode is None or self._leftover_alive():
            return False
        # Reaped by us, so /proc/<pid> is either absent or a different process that reused the pid.
        now = process_identity(self.pid)
        return now is None or now != self._started

    def _with_exit(self, error: GantryError) -> GantryError:
        """A failed start's error names its child and whether it is gone (reaped, and nothing
        it started left): whoever holds the residency judges its reclaim on that
        (`reclaim_verdict`), not on the time its start waited."""
        gone = self._process.returncode is not None and not self._leftover_alive()
        return with_child_exit(error, pid=self.pid, gone=gone)

    def _note_cancelled(self, exc: BaseException) -> None:
        """A cancelled start raises no error of its own (the cancellation must propagate): its
        CancelledError carries the child's exit instead, so that whoever holds the residency
        judges it as a failed start's (`cancelled_child`), not as released."""
        note_cancelled_child(
            exc,
            child_kind=self.child_kind,
            deployment_id=self.deployment_id,
            pid=self.pid,
            gone=self._process.returncode is not None and not self._leftover_alive(),
        )

    def _remove_private_dir(self) -> None:
        # Only once reaped: a child still running may be writing there.
        if self._private_dir is not None and self._process.returncode is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None

    def _record_stop(self, started: float) -> worker_gateway_pb2.UnloadEvidence:
        """The evidence of the child's end once the stop is done (claiming only what was
        observed), and one line saying it and how long the stop that began at `started` took."""
        returncode = self._process.returncode
        self._evidence = exit_evidence(self.pid, returncode, exited=self._confirmed_gone())
        self._log.info(
            "%s %s stopped: pid=%d %s exited=%s in %.2fs",
            self.child_kind,
            self.deployment_id,
            self.pid,
            describe_returncode(returncode),
            self._evidence.process_exited,
            time.monotonic() - started,
        )
        return self._evidence

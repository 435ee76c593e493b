"""The OS process behind a model host, however it was started: spawned, or forked by a warm pool.

`ModelHost` needs the same few things of either (pid, exit status, wait, signals, stderr), and the
same guarantee: the worker is the parent that reaps it, so its exit status is ours to read and
its pid cannot be reused before we have read it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

logger = logging.getLogger("gantry.worker.model_host")

CHILD_MODULE = "gantry.worker.model_host.child"

# What `asyncio` reports for a child someone else reaped: its status is lost.
_STATUS_LOST = 255


class HostProcess(Protocol):
    """A model host process this worker is the parent of."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None:
        """None until reaped; then the exit code, or minus the signal that ended it."""
        ...

    @property
    def stderr(self) -> asyncio.StreamReader: ...

    async def wait(self) -> int: ...

    def terminate(self) -> None:
        """SIGTERM; ProcessLookupError once reaped."""
        ...

    def kill(self) -> None:
        """SIGKILL; ProcessLookupError once reaped."""
        ...


class SpawnedProcess:
    """A host started by `asyncio.create_subprocess_exec` (asyncio's child watcher reaps it)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stderr is not None, "a host's stderr is always a pipe"
        self._process = process
        self._stderr = process.stderr

    @classmethod
    async def spawn(
        cls,
        python_executable: str,
        *,
        deployment_id: str,
        inbox_limit: int,
        channel: socket.socket,
        private_dir: Path,
        environment: Mapping[str, str],
    ) -> SpawnedProcess:
        """The cold path: a fresh interpreter that imports everything itself."""
        process = await asyncio.create_subprocess_exec(
            python_executable,
            # Isolated: no PYTHON* variables, no user site, and neither the cwd nor a script
            # directory on sys.path, so nothing planted next to the worker is imported.
            "-I",
            "-m",
            CHILD_MODULE,
            "--deployment-id",
            deployment_id,
            "--parent-pid",
            str(os.getpid()),
            "--channel-fd",
            str(channel.fileno()),
            "--private-dir",
            str(private_dir),
            "--inbox-limit",
            str(inbox_limit),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=(channel.fileno(),),
            cwd=private_dir,
            env=dict(environment),
        )
        return cls(process)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    @property
    def stderr(self) -> asyncio.StreamReader:
        return self._stderr

    async def wait(self) -> int:
        return await self._process.wait()

    def terminate(self) -> None:
        self._process.terminate()

    def kill(self) -> None:
        self._process.kill()


class ForkedProcess:
    """A host a fork server forked and the kernel reparented to this worker (its subreaper).

    No child watcher knows it: its exit is watched on a pidfd, which becomes readable when it
    exits, then it is reaped with `waitpid`. Signals go through the pidfd too, so a signal can
    never reach another process that reused the pid.
    """

    def __init__(
        self,
        *,
        pid: int,
        pidfd: int,
        stderr: asyncio.StreamReader,
        stderr_transport: asyncio.ReadTransport,
    ) -> None:
        self._pid = pid
        self._pidfd: int | None = pidfd
        self._stderr = stderr
        self._stderr_transport = stderr_transport
        self._returncode: int | None = None
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._loop.add_reader(pidfd, self._reap)

    @classmethod
    async def adopt(cls, pid: int, stderr_fd: int) -> ForkedProcess:
        """Watch `pid`, a child of this process, and read its stderr from `stderr_fd` (taken)."""
        try:
            pidfd = os.pidfd_open(pid)
        except BaseException:
            os.close(stderr_fd)
            raise
        try:
            loop = asyncio.get_running_loop()
            reader = asyncio.StreamReader(loop=loop)
            pipe = os.fdopen(stderr_fd, "rb", buffering=0)
        except BaseException:
            os.close(pidfd)
            os.close(stderr_fd)
            raise
        try:
            transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe
            )
        except BaseException:
            os.close(pidfd)
            pipe.close()
            raise
        return cls(pid=pid, pidfd=pidfd, stderr=reader, stderr_transport=transport)

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._returncode

    @property
    def stderr(self) -> asyncio.StreamReader:
        return self._stderr

    async def wait(self) -> int:
        # Shielded: a cancelled waiter must not cancel what every other waiter awaits.
        return await asyncio.shield(self._exited)

    def terminate(self) -> None:
        self._send(signal.SIGTERM)

    def kill(self) -> None:
        self._send(signal.SIGKILL)

    def _send(self, signum: signal.Signals) -> None:
        if self._pidfd is None:
            raise ProcessLookupError(f"model host {self._pid} was already reaped")
        signal.pidfd_send_signal(self._pidfd, signum)

    def _reap(self) -> None:
        """The pidfd is readable: the process has exited; collect its status (never blocks)."""
        assert self._pidfd is not None
        self._loop.remove_reader(self._pidfd)
        try:
            _, status = os.waitpid(self._pid, 0)
            returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            logger.warning("model host %d was reaped by someone else: status lost", self._pid)
            returncode = _STATUS_LOST
        os.close(self._pidfd)
        self._pidfd = None
        self._returncode = returncode
        if not self._exited.done():
            self._exited.set_result(returncode)

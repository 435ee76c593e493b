"""The worker's warm pool: one preloaded fork server per runtime environment, forking hosts.

A host forked from a server that has already imported torch is ready in well under a second
instead of paying the imports again. Custody is unchanged: the worker makes itself its children's
subreaper before it starts a server, so every forked host is reparented to the worker, which
reaps it (`host_process.ForkedProcess`). A server is only a cache: its death, or its eviction
when more environments are in use than `max_servers`, never touches a running host; the next
fork for its environment starts a new one.

The pool is not bound to an event loop (tests share one across their loops): servers are plain
`subprocess.Popen` children watched by threads, requests run in the loop's executor. A load the
pool cannot serve fails typed (RUNTIME_ENVIRONMENT_UNAVAILABLE, LOAD_FAILED on a timeout); it is
never silently spawned instead. `--no-warm-pool` is the explicit choice of the spawn path.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gantry.common.errors import GantryError
from gantry.worker.model_host import hardening
from gantry.worker.model_host.environments import (
    TELEMETRY_VARIABLES,
    TEST_HOOKS_VARIABLE,
    host_environment,
)
from gantry.worker.model_host.fork_server import (
    MAX_MESSAGE_BYTES,
    ForkProtocolError,
    ForkRequest,
    decode_reply,
)
from gantry.worker.model_host.host_process import ForkedProcess

logger = logging.getLogger("gantry.worker.model_host")

SERVER_MODULE = "gantry.worker.model_host.fork_server_main"
DEFAULT_MAX_SERVERS = 4
DEFAULT_START_TIMEOUT_S = 300.0
# A fork takes milliseconds; this bounds a server that stopped answering.
_FORK_ANSWER_S = 30.0
_SERVER_EXIT_S = 5.0
_STDERR_TAIL_LINES = 20

# Host variables read only after the fork (tracing, test hooks, CUDA at its lazy init) or per
# host (its dirs): hosts differing only in these share a server. Every other variable may be read
# by an import in the server, so it is part of the server's identity.
READ_AFTER_FORK = frozenset(
    {"HOME", "TMPDIR", "GANTRY_TRACE_FILE", TEST_HOOKS_VARIABLE, "CUDA_VISIBLE_DEVICES"}
    | TELEMETRY_VARIABLES
)


@dataclass(frozen=True)
class ServerKey:
    """What makes two hosts forkable from the same server: the interpreter, and the variables
    their imports may read."""

    python_executable: str
    environment: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, python_executable: str, environment: Mapping[str, str]) -> ServerKey:
        return cls(
            python_executable,
            tuple(sorted((k, v) for k, v in environment.items() if k not in READ_AFTER_FORK)),
        )


@dataclass(frozen=True, kw_only=True)
class ServerReady:
    pid: int
    import_seconds: float


class ForkServer:
    """One fork server process and the worker's end of its socket; thread-safe."""

    def __init__(self, key: ServerKey) -> None:
        self.key = key
        self.ready: concurrent.futures.Future[ServerReady] = concurrent.futures.Future()
        self._lock = threading.Lock()
        self._closing = False
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL_LINES)
        self._private_dir = Path(tempfile.mkdtemp(prefix="gantry-fork-server-"))
        scratch_dir = self._private_dir / "tmp"
        scratch_dir.mkdir(mode=0o700)
        environment = {
            **dict(key.environment),
            **host_environment({}, private_dir=self._private_dir, scratch_dir=scratch_dir),
        }
        self._control, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # From the event loop's thread, which lives as long as the worker: the server's
            # parent-death signal fires when the thread that started it exits.
            self.process = subprocess.Popen(
                [
                    key.python_executable,
                    "-I",
                    "-m",
                    SERVER_MODULE,
                    "--parent-pid",
                    str(os.getpid()),
                    "--control-fd",
                    str(server_end.fileno()),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(server_end.fileno(),),
                cwd=self._private_dir,
                env=environment,
            )
        except BaseException:
            self._control.close()
            shutil.rmtree(self._private_dir, ignore_errors=True)
            raise
        finally:
            server_end.close()
        threading.Thread(
            target=self._watch, name=f"fork-server-{self.process.pid}", daemon=True
        ).start()
        threading.Thread(
            target=self._await_ready, name=f"fork-server-ready-{self.process.pid}", daemon=True
        ).start()

    @property
    def alive(self) -> bool:
        # A server whose start failed is dead for the pool's purposes before its exit is reaped:
        # `poll()` says None while the process is still exiting, and while the watcher thread
        # waits on it (Popen lets one caller wait at a time), so a failed server looked alive to
        # whoever asked right after its load failed.
        if self._closing or (self.ready.done() and self.ready.exception() is not None):
            return False
        return self.process.poll() is None

    def fork(self, request: ForkRequest, fds: list[int]) -> int:
        """Blocking: send one request with `fds` (closed here, sent or not); the host's pid.

        Raises GantryError RUNTIME_ENVIRONMENT_UNAVAILABLE: refused, or the server is gone.
        """
        try:
            message = request.encode()
            with self._lock:
                if self._closing:
                    raise self._unavailable("the fork server is shutting down")
                self._control.settimeout(_FORK_ANSWER_S)
                try:
                    socket.send_fds(self._control, [message], fds)
                    answer = self._control.recv(MAX_MESSAGE_BYTES)
                except OSError as exc:
                    raise self._unavailable(f"the fork server did not answer: {exc!r}") from exc
        except ForkProtocolError as exc:
            raise self._unavailable(str(exc)) from exc
        finally:
            for fd in fds:
                os.close(fd)
        if not answer:
            raise self._unavailable("the fork server exited")
        try:
            reply = decode_reply(answer)
        except ForkProtocolError as exc:
            raise self._unavailable(f"the fork server answered garbage: {exc}") from exc
        if reply["kind"] == "forked" and isinstance(reply.get("pid"), int):
            return int(reply["pid"])
        raise self._unavailable(f"the fork server refused: {reply.get('error', reply)}")

    def close(self) -> None:
        """Blocking: end the server (EOF on its socket, then signals) and reap it."""
        self.ask_to_exit()
        self.finish_exit(time.monotonic() + _SERVER_EXIT_S)

    def ask_to_exit(self) -> None:
        """EOF on its socket: it exits by itself once it has answered what it was asked."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._control.shutdown(socket.SHUT_RDWR)

    def finish_exit(self, deadline: float) -> None:
        """Blocking: wait for the exit `ask_to_exit` asked for until `deadline` (monotonic),
        SIGKILL it then, reap it, and remove what it left."""
        try:
            self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with self._lock:
            self._control.close()
        shutil.rmtree(self._private_dir, ignore_errors=True)
        if not self.ready.done():
            self.ready.set_exception(self._unavailable("the fork server was closed"))

    def stderr_tail(self) -> str:
        return "\n".join(self._stderr_tail)

    def _unavailable(self, why: str) -> GantryError:
        tail = self.stderr_tail()
        return GantryError(
            "RUNTIME_ENVIRONMENT_UNAVAILABLE",
            f"warm pool for {self.key.python_executable!r}: {why}"
            + (f"; server stderr:\n{tail}" if tail else ""),
        )

    def _await_ready(self) -> None:
        try:
            with self._lock:
                # The first message; no request is sent before it (they wait for `ready`).
                self._control.settimeout(DEFAULT_START_TIMEOUT_S)
                hello = decode_reply(self._control.recv(MAX_MESSAGE_BYTES) or b"{}")
        except (OSError, ForkProtocolError) as exc:
            self._fail_ready(self._unavailable(f"the fork server did not start: {exc}"))
            return
        if hello["kind"] == "ready":
            self.ready.set_result(
                ServerReady(pid=int(hello["pid"]), import_seconds=float(hello["import_seconds"]))
            )
        else:
            self._fail_ready(self._unavailable(f"the fork server failed: {hello.get('error')}"))

    def _fail_ready(self, error: GantryError) -> None:
        if not self.ready.done():
            self.ready.set_exception(error)

    def _watch(self) -> None:
        """Log the server's stderr, and its end when that was not asked for."""
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            line = raw.decode("utf-8", errors="replace").rstrip()
            if line:
                self._stderr_tail.append(line)
                logger.info("fork-server %d: %s", self.process.pid, line)
        returncode = self.process.wait()
        self.process.stderr.close()
        if not self._closing:
            logger.warning(
                "fork server %d for %s exited (%s); the next load starts a new one",
                self.process.pid,
                self.key.python_executable,
                returncode,
            )
        self._fail_ready(self._unavailable(f"the fork server exited ({returncode})"))


class WarmPool:
    """Fork servers by environment, at most `max_servers` (the least recently used goes)."""

    def __init__(
        self,
        *,
        max_servers: int = DEFAULT_MAX_SERVERS,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ) -> None:
        if max_servers < 1:
            raise ValueError("a warm pool needs room for at least one server")
        self._max_servers = max_servers
        self._start_timeout_s = start_timeout_s
        self._servers: collections.OrderedDict[ServerKey, ForkServer] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._subreaper = False
        self._closed = False

    def prewarm(self, python_executable: str, worker_environment: Mapping[str, str]) -> None:
        """Start the server hosts of `python_executable` will need, in the background."""
        key = ServerKey.of(python_executable, _key_environment(worker_environment))
        self._server_for(key)

    def server_for_environment(
        self, python_executable: str, worker_environment: Mapping[str, str]
    ) -> ForkServer | None:
        """The running server hosts of this environment would be forked from, if any."""
        key = ServerKey.of(python_executable, _key_environment(worker_environment))
        with self._lock:
            server = self._servers.get(key)
        return server if server is not None and server.alive else None

    async def fork_host(
        self,
        *,
        python_executable: str,
        environment: Mapping[str, str],
        deployment_id: str,
        private_dir: Path,
        inbox_limit: int,
        channel: socket.socket,
        timeout_s: float,
    ) -> ForkedProcess:
        """Fork a host with `environment` (its whole environment) holding `channel`; the worker
        is its parent when this returns. Raises GantryError (RUNTIME_ENVIRONMENT_UNAVAILABLE;
        LOAD_FAILED when the server is not ready within `timeout_s`); nothing outlives a
        failure or a cancellation."""
        server = self._server_for(ServerKey.of(python_executable, environment))
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(asyncio.wrap_future(server.ready))
        except TimeoutError as exc:
            raise GantryError(
                "LOAD_FAILED",
                f"the warm pool's fork server for {python_executable!r} was not ready within "
                f"{timeout_s:g}s",
                deployment_id=deployment_id,
            ) from exc
        request = ForkRequest(
            deployment_id=deployment_id,
            parent_pid=os.getpid(),
            private_dir=str(private_dir),
            inbox_limit=inbox_limit,
            environment=environment,
        )
        stderr_read, stderr_write = os.pipe2(os.O_CLOEXEC)
        try:
            # Duplicates the request owns: a cancelled caller may close its own meanwhile.
            fds = [os.dup(channel.fileno()), stderr_write]
        except BaseException:
            os.close(stderr_read)
            os.close(stderr_write)
            raise
        forking = asyncio.get_running_loop().run_in_executor(None, server.fork, request, fds)
        try:
            pid = await asyncio.shield(forking)
        except asyncio.CancelledError:
            os.close(stderr_read)
            # Custody: the host forked for a caller who left is still ours until it is reaped,
            # so the cancellation completes only after that (the fork answers in milliseconds).
            await _end_unclaimed_host(forking)
            raise
        except BaseException:
            os.close(stderr_read)
            raise
        try:
            return await ForkedProcess.adopt(pid, stderr_read)
        except BaseException:
            await _end_host_now(pid)
            raise

    def close(self, *, exit_s: float = _SERVER_EXIT_S) -> None:
        """Blocking: stop and reap every server (running hosts are not touched). All are asked
        at once and share one deadline, `exit_s` from now, before they are SIGKILLed: a
        server's interpreter takes seconds to tear its imports down."""
        with self._lock:
            self._closed = True
            servers = list(self._servers.values())
            self._servers.clear()
        for server in servers:
            server.ask_to_exit()
        deadline = time.monotonic() + exit_s
        for server in servers:
            server.finish_exit(deadline)

    async def aclose(self, *, exit_s: float = _SERVER_EXIT_S) -> None:
        await asyncio.to_thread(self.close, exit_s=exit_s)

    def _server_for(self, key: ServerKey) -> ForkServer:
        evicted: list[ForkServer] = []
        with self._lock:
            if self._closed:
                raise GantryError("RUNTIME_ENVIRONMENT_UNAVAILABLE", "the warm pool is closed")
            server = self._servers.get(key)
            if server is not None and not server.alive:
                evicted.append(self._servers.pop(key))
                server = None
            if server is None:
                if not self._subreaper:
                    # Before the first server exists: its forks must find us as their reaper.
                    try:
                        hardening.become_child_subreaper()
                    except OSError as exc:
                        raise GantryError(
                            "RUNTIME_ENVIRONMENT_UNAVAILABLE",
                            f"the warm pool cannot keep custody of forked hosts: {exc}",
                        ) from exc
                    self._subreaper = True
                while len(self._servers) >= self._max_servers:
                    evicted.append(self._servers.popitem(last=False)[1])
                try:
                    server = ForkServer(key)
                except OSError as exc:
                    raise GantryError(
                        "RUNTIME_ENVIRONMENT_UNAVAILABLE",
                        f"cannot start a fork server with {key.python_executable!r}: {exc}",
                    ) from exc
                self._servers[key] = server
            self._servers.move_to_end(key)
        for old in evicted:
            threading.Thread(target=old.close, name="fork-server-close", daemon=True).start()
        return server


def _key_environment(worker_environment: Mapping[str, str]) -> dict[str, str]:
    """The host environment minus its per-host dirs, for a key (which ignores those anyway)."""
    placeholder = Path("/nonexistent")
    return host_environment(worker_environment, private_dir=placeholder, scratch_dir=placeholder)


def _end_host(pid: int) -> None:
    """A forked host nobody will own: kill and reap it (it is our child), off the loop."""

    def end() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)

    threading.Thread(target=end, name=f"end-unclaimed-host-{pid}", daemon=True).start()


async def _end_host_now(pid: int) -> None:
    """Kill and reap a forked host nobody will own, before returning. Cancelled meanwhile, the
    reap still completes in its thread."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    await asyncio.shield(asyncio.to_thread(_reap, pid))


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


async def _end_unclaimed_host(forking: asyncio.Future[int]) -> None:
    """The host `forking` makes, if it makes one, killed and reaped: awaited when possible,
    else (cancelled again while waiting) as soon as the fork answers."""
    try:
        pid = await asyncio.shield(forking)
    except asyncio.CancelledError:
        forking.add_done_callback(_end_answered_host)
        return
    except BaseException:
        return  # no host was forked
    await _end_host_now(pid)


def _end_answered_host(forking: asyncio.Future[int]) -> None:
    if not forking.cancelled() and forking.exception() is None:
        _end_host(forking.result())

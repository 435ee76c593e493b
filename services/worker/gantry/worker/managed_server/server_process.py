"""One managed server process: started by the worker, ready when it answers, checked to listen
only on loopback, stopped with a grace period and verified gone. A `SupervisedHost`, so
supervision restarts it with backoff like a model host.

Invariants:
- Its argv comes from the kind table (`kinds`) and the verified copy, never from a request; its
  environment is the model host's allow-list (offline flags, no secrets, private HOME and TMPDIR).
- It runs in its own process group and gets SIGKILL when the worker thread that spawned it dies
  (as a model host does, `hardening.die_with_parent`); stop and crash handling signal the whole
  group, so a helper it forked cannot keep the port or the memory.
- It is never handed out before it answered GET /v1/models on the worker's port, holds that port
  itself, and listens nowhere but loopback. A start that fails any of these, times out or is
  cancelled leaves no process of it behind before it raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gantry.common.errors import GantryError
from gantry.v1 import model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.managed_server import loopback
from gantry.worker.managed_server.kinds import (
    LOOPBACK_HOST,
    ServerInputs,
    ServerKind,
    server_kind,
)
from gantry.worker.managed_server.openai_protocol import MODELS
from gantry.worker.managed_server.server_calls import ISOLATION_REASON, ServerCalls
from gantry.worker.model_host import sandbox
from gantry.worker.model_host.custody import ChildCustody, private_workspace
from gantry.worker.model_host.exit_status import crashed_error, describe_returncode
from gantry.worker.model_host.landlock import Isolation, IsolationLevel
from gantry.worker.model_host.process import HostLaunchSpec
from gantry.worker.model_host.stderr_tail import StderrTail

logger = logging.getLogger("gantry.worker.managed_server")

OnServerExit = Callable[[Any, int], None]
PortAllocator = Callable[[], int]

_PR_SET_PDEATHSIG = 1
_EXIT_ORPHANED = 4
# Readiness is a poll (a server announces nothing else); each try is short, the sum is the
# load timeout.
_READY_POLL_S = 0.1
_READY_TRY_S = 2.0
_READY_LOG_EVERY_S = 5.0
_KILL_GRACE_S = 5.0


# Arms the parent-death signal, then becomes the server: PR_SET_PDEATHSIG survives execve. Run as
# its own interpreter (no site, no imports of ours) rather than as a preexec_fn: Python code
# between fork and exec in a threaded worker can crash the child (it did: a fork handler of a
# third-party package segfaulted there). argv: the worker's pid, then the server's argv.
_TRAMPOLINE = f"""
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, signal.SIGKILL, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    os._exit({_EXIT_ORPHANED})
os.execv(sys.argv[2], sys.argv[2:])
"""


def _dying_with_worker(argv: tuple[str, ...]) -> tuple[str, ...]:
    """`argv` started through the trampoline: SIGKILL when the worker dies (exit at once if it
    died before that was armed)."""
    return (sys.executable, "-I", "-S", "-c", _TRAMPOLINE, str(os.getpid()), *argv)


@dataclass(frozen=True, kw_only=True)
class ServerLaunch:
    """One server process to start. Built from a HostLaunchSpec by `launch_for`; a test may
    build one around its own script (the same checks then apply to it)."""

    deployment_id: str
    kind: ServerKind
    argv: tuple[str, ...]
    executable: str
    port: int
    served_name: str
    max_new_tokens: int = 0
    load_timeout_s: float = 300.0
    max_pending: int = 256
    environment: Mapping[str, str] = field(default_factory=dict)  # the worker's, filtered later


def launch_for(spec: HostLaunchSpec, *, port: int) -> ServerLaunch:
    """The launch of the server kind `spec.adapter.adapter` names (RUNTIME_INCOMPATIBLE for
    a model-host adapter or an artifact set the kind cannot be given)."""
    kind = server_kind(spec.adapter.adapter)
    if kind is None:
        raise GantryError(
            "RUNTIME_INCOMPATIBLE",
            f"adapter {spec.adapter.adapter!r} is not a managed server kind",
            adapter=spec.adapter.adapter,
        )
    command = kind.command(
        ServerInputs(
            python_executable=spec.python_executable,
            model_directory=spec.model_directory,
            port=port,
            settings=spec.adapter,
            served_name=spec.deployment_id,
        )
    )
    return ServerLaunch(
        deployment_id=spec.deployment_id,
        kind=kind,
        argv=command.argv,
        executable=command.executable,
        port=port,
        served_name=spec.deployment_id,
        max_new_tokens=spec.adapter.max_new_tokens,
        load_timeout_s=spec.load_timeout_s,
        max_pending=spec.max_pending,
        environment={**os.environ, **spec.env},
    )


def check_executable(executable: str, *, deployment_id: str, kind: str) -> None:
    path = Path(executable)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise GantryError(
            "RUNTIME_ENVIRONMENT_UNAVAILABLE",
            f"the {kind} executable {executable!r} does not exist or is not executable",
            deployment_id=deployment_id,
            adapter=kind,
        )


class ManagedServer(ChildCustody[asyncio.subprocess.Process], ServerCalls):
    """A running managed server. Create with `await ManagedServer.start(spec)` (or `launch`)."""

    child_kind = "managed server"
    _log = logger

    def __init__(
        self,
        *,
        launch: ServerLaunch,
        process: asyncio.subprocess.Process,
        output: StderrTail,
        private_dir: Path,
        on_exit: OnServerExit | None,
    ) -> None:
        super().__init__(process=process, private_dir=private_dir)
        self._launch = launch
        self._kind = launch.kind
        self._served_name = launch.served_name
        self._max_new_tokens = launch.max_new_tokens
        self._max_pending = launch.max_pending
        self._in_flight = 0
        self._output = output
        self._on_exit = on_exit
        # trust_env=False: no proxy variable of the worker may route loopback calls elsewhere.
        self._client = httpx.AsyncClient(
            base_url=f"http://{LOOPBACK_HOST}:{launch.port}", trust_env=False, timeout=None
        )
        self._ready: model_host_pb2.HostReady | None = None
        self._exit_task: asyncio.Task[int] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    @classmethod
    async def start(
        cls,
        spec: HostLaunchSpec,
        *,
        on_exit: OnServerExit | None = None,
        trace_context: Mapping[str, str] | None = None,
        port_allocator: PortAllocator = loopback.allocate_loopback_port,
    ) -> ManagedServer:
        """Start the server `spec` names on a port the worker allocates; see `launch`."""
        refusal = sandbox.shortfall(
            spec.require_isolation,
            Isolation(level=IsolationLevel.NONE, reason=ISOLATION_REASON),
            deployment_id=spec.deployment_id,
        )
        if refusal is not None:
            raise refusal
        return await cls.launch(launch_for(spec, port=port_allocator()), on_exit=on_exit)

    @classmethod
    async def launch(
        cls, launch: ServerLaunch, *, on_exit: OnServerExit | None = None
    ) -> ManagedServer:
        """Start `launch` and wait until it answers on loopback, holds its port and listens
        nowhere else. Raises GantryError: RUNTIME_ENVIRONMENT_UNAVAILABLE (no executable),
        LOAD_FAILED (port in use, the server exited or did not answer in time: with its output
        tail), RUNTIME_INCOMPATIBLE (it listens beyond loopback: killed, verified gone)."""
        started = time.monotonic()
        name = launch.deployment_id
        check_executable(launch.executable, deployment_id=name, kind=launch.kind.name)
        loopback.check_port_free(launch.port, deployment_id=name)
        private_dir, environment = private_workspace(
            launch.environment, prefix=f"gantry-server-{name}-"
        )
        process = await _spawn_server(launch, private_dir=private_dir, environment=environment)
        assert process.stdout is not None
        server = cls(
            launch=launch,
            process=process,
            output=StderrTail(process.stdout, name),
            private_dir=private_dir,
            on_exit=on_exit,
        )
        await server._await_ready(started)
        server._serve(started)
        return server

    async def _await_ready(self, started: float) -> None:
        """An answer on loopback within the load timeout, from this process, listening nowhere
        else; a server that fails that, runs out of time or is cancelled meanwhile is killed with
        its group and reaped before this raises."""
        timeout_s = self._launch.load_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                await self._await_answer(started)
            self._check_listeners()
        except BaseException as exc:
            await self._abandon()
            if isinstance(exc, TimeoutError):
                raise self._with_exit(
                    self._load_error(f"did not answer GET {MODELS} within {timeout_s:g}s")
                ) from exc
            if isinstance(exc, GantryError):
                self._with_exit(exc)  # judged by the same reclaim rule as a model host's
            self._note_cancelled(exc)
            raise

    def _serve(self, started: float) -> None:
        """A ready server is handed out: what it reports, and its exit watched from now on."""
        launch = self._launch
        load_seconds = time.monotonic() - started
        self._ready = model_host_pb2.HostReady(
            pid=self.pid,
            load_seconds=load_seconds,
            rss_bytes=self.rss_bytes(),
            runtime_versions={"server": launch.kind.name, "port": str(launch.port)},
            isolation="NONE",
            isolation_reason=ISOLATION_REASON,
        )
        self._exit_task = asyncio.create_task(
            self._watch_exit(), name=f"managed-server-exit-{launch.deployment_id}"
        )
        logger.info(
            "managed server %s (%s) ready: pid=%d port=%d load_seconds=%.2f rss=%d",
            launch.deployment_id,
            launch.kind.name,
            self.pid,
            launch.port,
            load_seconds,
            self.rss_bytes(),
        )

    async def stop(self, *, grace_s: float = 10.0) -> wg.UnloadEvidence:
        """SIGTERM to its group, SIGKILL after `grace_s`, reaped; `process_exited` only when the
        process is reaped, its pid names no later process and nothing of its group is left."""
        return await self.terminate(grace_s=grace_s)

    async def terminate(
        self, *, grace_s: float, reap_s: float = _KILL_GRACE_S
    ) -> wg.UnloadEvidence:
        """`stop` with a bound on the reap after SIGKILL as well: the worker's own stop, whose
        deadlines every host shares. SIGTERM is how a server is asked to stop in any case."""
        if self._evidence is not None and self._evidence.process_exited:
            return self._evidence
        started = time.monotonic()
        self._stopping = True
        if self._process.returncode is None:
            self._signal_group(signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
            if not await self._exited_within(grace_s):
                logger.warning("managed server %s ignored SIGTERM; SIGKILL", self.deployment_id)
                self._signal_group(signal.SIGKILL)
                await self._exited_within(reap_s)
        if self._group_alive():
            self._signal_group(signal.SIGKILL)  # a helper it forked outlived it
        await self._close()
        return self._record_stop(started)

    async def kill(self) -> wg.UnloadEvidence:
        self._stopping = True
        self._signal_group(signal.SIGKILL)
        await self._exited_within(_KILL_GRACE_S)
        return await self.stop(grace_s=0)

    def kill_unresponsive(self, why: str) -> None:
        """It missed a liveness deadline: SIGKILL its group; its exit still reaches `on_exit`
        (supervision restarts it), and calls fail with RUNTIME_UNRESPONSIVE from now on."""
        if self._unresponsive is not None or self._process.returncode is not None:
            return
        self._unresponsive = GantryError(
            "RUNTIME_UNRESPONSIVE",
            f"managed server {self.deployment_id!r} (pid {self.pid}) is unresponsive: {why}",
            deployment_id=self.deployment_id,
            pid=str(self.pid),
        )
        logger.error("%s; killing it", self._unresponsive.message)
        self._signal_group(signal.SIGKILL)

    # -- state ---------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._launch.port

    @property
    def deployment_id(self) -> str:
        return self._launch.deployment_id

    @property
    def ready(self) -> model_host_pb2.HostReady:
        assert self._ready is not None, "a ManagedServer is only handed out once ready"
        return self._ready

    @property
    def unloaded(self) -> model_host_pb2.HostUnloaded | None:
        return None  # a server measures nothing of itself after release

    def output_tail(self) -> list[str]:
        return self._output.lines()

    # -- internals -----------------------------------------------------------------------------

    async def _await_answer(self, started: float) -> None:
        logged = started
        while True:
            if self._process.returncode is not None:
                await self._output.settle()
                raise self._load_error(
                    f"exited before it answered ({describe_returncode(self._process.returncode)})"
                )
            with contextlib.suppress(httpx.HTTPError, TimeoutError):
                async with asyncio.timeout(_READY_TRY_S):
                    response = await self._client.get(MODELS)
                if response.status_code == 200:
                    return
            now = time.monotonic()
            if now - logged >= _READY_LOG_EVERY_S:
                logged = now
                logger.info(
                    "managed server %s (pid %d) not answering yet after %.0fs (limit %gs)",
                    self.deployment_id,
                    self.pid,
                    now - started,
                    self._launch.load_timeout_s,
                )
            await asyncio.sleep(_READY_POLL_S)

    def _check_listeners(self) -> None:
        held, beyond = loopback.server_listeners(self.pid)
        if beyond:
            raise GantryError(
                "RUNTIME_INCOMPATIBLE",
                f"the {self._kind.name} server of {self.deployment_id!r} bound beyond loopback "
                f"({', '.join(s.describe() for s in beyond)}); it was stopped: a managed server "
                f"may listen on {LOOPBACK_HOST} only",
                deployment_id=self.deployment_id,
                refusal="BOUND_BEYOND_LOOPBACK",
                pid=str(self.pid),
            )
        if not any(s.port == self._launch.port for s in held):
            # Something answered on the port, but not this process: never talk to it.
            raise GantryError(
                "LOAD_FAILED",
                f"port {self._launch.port} answered, but the {self._kind.name} server "
                f"(pid {self.pid}) does not hold it; refusing to use it",
                deployment_id=self.deployment_id,
                refusal="PORT_NOT_HELD",
                pid=str(self.pid),
            )

    def _load_error(self, what: str) -> GantryError:
        tail = self._output.text()
        message = f"the {self._kind.name} server of {self.deployment_id!r} {what}"
        return GantryError(
            "LOAD_FAILED",
            f"{message}; output tail:\n{tail}" if tail else message,
            deployment_id=self.deployment_id,
        )

    async def _abandon(self) -> None:
        """A failed or cancelled start: nothing of it may outlive it."""
        self._stopping = True
        self._signal_group(signal.SIGKILL)
        await self._exited_within(_KILL_GRACE_S)
        await self._close()

    def _signal_group(self, signum: signal.Signals) -> None:
        # The group id is the pid (start_new_session); until the leader is reaped its pid, and
        # so the group id, cannot be reused.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signum)

    def _leftover_alive(self) -> bool:
        return self._group_alive()

    def _group_alive(self) -> bool:
        try:
            os.killpg(self._process.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    async def _exited_within(self, timeout_s: float) -> bool:
        if self._process.returncode is not None:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._process.wait()), max(timeout_s, 0.01))
        return self._process.returncode is not None

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            await self._client.aclose()
        task = self._exit_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._output.settle()
        self._remove_private_dir()

    def _crashed_error(self) -> GantryError | None:
        if self._process.returncode is None:
            return None
        if self._unresponsive is not None:
            return self._unresponsive
        return self._exit_error()

    def _exit_error(self) -> GantryError:
        return crashed_error(
            "managed server",
            deployment_id=self.deployment_id,
            pid=self.pid,
            returncode=self._process.returncode,
            output=self._output.lines(),
            output_name="output",
        )

    async def _watch_exit(self) -> int:
        returncode = await self._process.wait()
        # A helper of the dead leader must not keep the port (or the memory) for the restart.
        self._signal_group(signal.SIGKILL)
        await self._output.settle()
        if not self._stopping:
            crashed = self._crashed_error()
            logger.error("%s", crashed.message if crashed else "managed server exited")
            if self._on_exit is not None:
                try:
                    self._on_exit(self, returncode)
                except Exception:
                    logger.exception("on_exit of managed server %s failed", self.deployment_id)
        return returncode


async def _spawn_server(
    launch: ServerLaunch, *, private_dir: Path, environment: Mapping[str, str]
) -> asyncio.subprocess.Process:
    """The server process, in its own group and dying with the worker; RUNTIME_ENVIRONMENT_
    UNAVAILABLE (its private directory removed) when it cannot be started."""
    try:
        return await asyncio.create_subprocess_exec(
            *_dying_with_worker(launch.argv),
            stdin=asyncio.subprocess.DEVNULL,
            # One stream: servers log to either, and both end up in the tail and the log.
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=private_dir,
            env=environment,
            start_new_session=True,  # its own process group, signalled as one
        )
    except OSError as exc:
        shutil.rmtree(private_dir, ignore_errors=True)
        raise GantryError(
            "RUNTIME_ENVIRONMENT_UNAVAILABLE",
            f"cannot start the {launch.kind.name} server with {launch.executable!r}: {exc}",
            deployment_id=launch.deployment_id,
        ) from exc

"""The worker's seam to one model host child: start (spawned, or forked by a warm pool), await
ready, multiplex its requests (`host_calls`), stop, verify."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2, model_host_pb2, worker_gateway_pb2
from gantry.worker.model_host import sandbox
from gantry.worker.model_host.cpu_calibration import HostCpu
from gantry.worker.model_host.custody import (
    ChildCustody,
    note_cancelled_child,
    private_workspace,
)
from gantry.worker.model_host.exit_status import crashed_error, describe_returncode
from gantry.worker.model_host.framing import FrameError, FrameSender, read_frame_async
from gantry.worker.model_host.host_calls import HostCalls, OnProgress
from gantry.worker.model_host.host_process import HostProcess, SpawnedProcess
from gantry.worker.model_host.inbox import DEFAULT_INBOX_LIMIT
from gantry.worker.model_host.landlock import Isolation
from gantry.worker.model_host.sandbox import IsolationRequirement
from gantry.worker.model_host.span_relay import export_host_spans
from gantry.worker.model_host.stderr_tail import StderrTail

if TYPE_CHECKING:
    from gantry.worker.model_host.warm_pool import WarmPool

logger = logging.getLogger("gantry.worker.model_host")

# Bounds on waits that only collect evidence; none of them delays an answer to a caller.
_EXIT_AFTER_FAILURE_S = 5.0
_CHANNEL_CLOSED_GRACE_S = 1.0
_SHUTDOWN_SEND_S = 1.0
_TERM_GRACE_S = 5.0
_KILL_GRACE_S = 5.0
DEFAULT_MAX_PENDING = 256
# A load waits this long at most for its environment's CPU calibration (once per machine and
# environment, about 10 s on an idle 2-core node); past it the host waits PASSIVE.
_CPU_CALIBRATION_WAIT_S = 30.0

OnExit = Callable[["ModelHost", int], None]


@dataclass(frozen=True, kw_only=True)
class HostLaunchSpec:
    deployment_id: str
    model_directory: Path
    adapter: common_pb2.AdapterSettings
    python_executable: str
    # Overrides of the worker's environment; the host still gets only the allow-listed names.
    env: Mapping[str, str] = field(default_factory=dict)
    # Below this the host refuses to load (RUNTIME_ENVIRONMENT_UNAVAILABLE).
    require_isolation: IsolationRequirement = field(default_factory=IsolationRequirement)
    load_timeout_s: float = 300.0
    # Requests awaiting an answer in the parent, and frames queued in the child: both bounded,
    # answered QUEUE_FULL beyond.
    max_pending: int = DEFAULT_MAX_PENDING
    inbox_limit: int = DEFAULT_INBOX_LIMIT
    # Tests only: the host takes the test-only magic inputs (environments.TEST_HOOKS_VARIABLE).
    # The worker never sets it, and `env` cannot carry the switch past the allow-list.
    test_hooks: bool = False


class ModelHost(ChildCustody[HostProcess], HostCalls):
    """One running model host child. Create with `await ModelHost.start(spec)`; what it asks
    the child (embed, rerank, transcribe, recognize_text, ...) is `HostCalls`.

    After an unexpected exit (reported to `on_exit`) the host answers RUNTIME_CRASHED; the owner
    still calls `stop()`, which closes the channel and returns the exit evidence. A host its owner
    found hung (`kill_unresponsive`) answers RUNTIME_UNRESPONSIVE at once from then on.
    """

    child_kind = "model host"
    _log = logger

    def __init__(
        self,
        *,
        spec: HostLaunchSpec,
        process: HostProcess,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        stderr: StderrTail,
        on_exit: OnExit | None,
        private_dir: Path | None = None,
    ) -> None:
        super().__init__(process=process, private_dir=private_dir)
        self._spec = spec
        self._reader = reader
        self._writer = writer
        self._stderr = stderr
        self._on_exit = on_exit
        self._ready: model_host_pb2.HostReady | None = None
        self._pending: dict[int, asyncio.Future[model_host_pb2.HostResponse]] = {}
        # Where the frames before an answer go (a generation's deltas), by request id.
        self._progress: dict[int, OnProgress] = {}
        self._request_ids = itertools.count(1)
        self._frames = FrameSender(writer)
        # What the child measured after releasing the model, when it answered Shutdown so.
        self._unloaded: model_host_pb2.HostUnloaded | None = None
        self._cancel_sends: set[asyncio.Task[None]] = set()
        self._response_task: asyncio.Task[None] | None = None
        self._exit_task: asyncio.Task[int] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    @classmethod
    async def start(
        cls,
        spec: HostLaunchSpec,
        *,
        on_exit: OnExit | None = None,
        trace_context: Mapping[str, str] | None = None,
        warm_pool: WarmPool | None = None,
        host_cpu: HostCpu | None = None,
    ) -> ModelHost:
        """Start the child and wait until it has loaded and health-checked the model.

        The child is spawned, or forked by `warm_pool` when given (its imports already done);
        either way this worker is its parent. Its CPU threads wait as `host_cpu` measured for its
        environment when given (else PASSIVE, environments.HOST_CPU_DEFAULTS). Raises
        GantryError: the child's own failure (LOAD_FAILED, HEALTH_FAILED), LOAD_FAILED when it
        dies or times out first, RUNTIME_ENVIRONMENT_UNAVAILABLE when it cannot be started (a
        warm pool that cannot fork it never falls back to a spawn). The child never outlives a
        failed or cancelled start; `load_timeout_s` bounds the whole start, a wait for the warm
        pool's server (and for `host_cpu`'s measurement) included.
        """
        deadline = asyncio.get_running_loop().time() + spec.load_timeout_s
        # The CPU wait policy `host_cpu` measured for this environment (cpu_calibration); what
        # the operator set wins over it. A calibration in progress is awaited, within bounds.
        worker_environment = {**os.environ, **spec.env}
        cpu = (
            await host_cpu.choice_for(
                spec.python_executable,
                worker_environment,
                wait_s=min(_CPU_CALIBRATION_WAIT_S, spec.load_timeout_s / 2),
            )
            if host_cpu is not None
            else None
        )
        private_dir, environment = private_workspace(
            {**(cpu.environment() if cpu else {}), **worker_environment},
            prefix=f"gantry-host-{spec.deployment_id}-",
            test_hooks=spec.test_hooks,
        )
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        process = await _start_child(
            spec,
            environment=environment,
            private_dir=private_dir,
            parent_end=parent_end,
            child_end=child_end,
            warm_pool=warm_pool,
        )
        stderr = StderrTail(process.stderr, spec.deployment_id)
        try:
            reader, writer = await asyncio.open_unix_connection(sock=parent_end)
        except BaseException as exc:
            # Cancelled (an overtaking unload) or failed before custody holds the child: it is
            # killed and reaped here, so the caller's "gone" is never claimed of a live pid.
            parent_end.close()
            gone = await _end_unconnected(process, stderr, private_dir)
            note_cancelled_child(
                exc,
                child_kind=cls.child_kind,
                deployment_id=spec.deployment_id,
                pid=process.pid,
                gone=gone,
            )
            raise
        host = cls(
            spec=spec,
            process=process,
            reader=reader,
            writer=writer,
            stderr=stderr,
            on_exit=on_exit,
            private_dir=private_dir,
        )
        await host._await_ready(deadline, trace_context or {})
        if cpu is not None and host._ready is not None:
            # In the load's evidence (runtime_versions): what this host's threads do, and why.
            host._ready.runtime_versions.update(cpu.evidence())
        await host._enforce_isolation()
        host._serve()
        return host

    async def _await_ready(self, deadline: float, trace_context: Mapping[str, str]) -> None:
        """The load, bounded by the start's `deadline`; a child that fails it, runs out of time
        or is cancelled meanwhile is killed and reaped before this raises."""
        spec = self._spec
        try:
            async with asyncio.timeout_at(deadline):
                self._ready = await self._load(trace_context)
        except BaseException as exc:
            await self._abandon()
            if isinstance(exc, TimeoutError):
                raise self._with_exit(
                    self._load_error(
                        f"model host for {spec.deployment_id!r} was not ready within "
                        f"{spec.load_timeout_s:g}s"
                    )
                ) from exc
            if isinstance(exc, GantryError):
                self._with_exit(exc)
            self._note_cancelled(exc)
            raise

    async def _enforce_isolation(self) -> None:
        refusal = sandbox.shortfall(
            self._spec.require_isolation, self.isolation, deployment_id=self.deployment_id
        )
        if refusal is not None:
            # A child that ignored the requirement (an older one in another environment).
            await self.stop(grace_s=_SHUTDOWN_SEND_S)
            raise refusal

    def _serve(self) -> None:
        """A loaded child starts serving: its answers are dispatched and its exit watched."""
        name = self.deployment_id
        self._response_task = asyncio.create_task(
            self._dispatch_responses(), name=f"model-host-responses-{name}"
        )
        self._exit_task = asyncio.create_task(self._watch_exit(), name=f"model-host-exit-{name}")
        logger.info(
            "model host %s ready: pid=%d dim=%d load_seconds=%.2f isolation=%s (%s)",
            name,
            self.pid,
            self.ready.dim,
            self.ready.load_seconds,
            self.ready.isolation or "NONE",
            self.ready.isolation_reason,
        )

    async def stop(self, *, grace_s: float = 10.0) -> worker_gateway_pb2.UnloadEvidence:
        """Ask the child to exit, escalate to SIGTERM then SIGKILL, and report whether it is gone.

        `process_exited` is True only when the child was reaped and its pid no longer names it;
        only then is there an exit code (`has_exit_code`, an exit by itself) or the signal that
        ended it (`exit_signal`). A stop that could not confirm it may be retried. A HostUnloaded
        the child sent before exiting is kept in `unloaded`.
        """
        if self._evidence is not None and self._evidence.process_exited:
            return self._evidence
        started = time.monotonic()
        self._stopping = True
        if self._process.returncode is None:
            with contextlib.suppress(OSError, FrameError, TimeoutError):
                await asyncio.wait_for(
                    self._send(model_host_pb2.HostRequest(shutdown=model_host_pb2.Shutdown())),
                    _SHUTDOWN_SEND_S,
                )
            if not await self._exited_within(grace_s):
                logger.warning("model host %s ignored Shutdown; SIGTERM", self.deployment_id)
                await self._signal_then_kill(_TERM_GRACE_S, _KILL_GRACE_S)
        return await self._conclude(started)

    async def terminate(
        self, *, grace_s: float, reap_s: float = _KILL_GRACE_S
    ) -> worker_gateway_pb2.UnloadEvidence:
        """The worker itself is stopping: SIGTERM now, SIGKILL once `grace_s` has passed, then
        wait at most `reap_s` for the reap; evidence as `stop` reports it.

        No Shutdown is asked first: a host busy in a forward pass would not read it, and one that
        does releases its model object by object (seconds, with a large heap) where its exit
        releases everything at once. Nothing is measured of the release (`unloaded` stays None).
        """
        if self._evidence is not None and self._evidence.process_exited:
            return self._evidence
        started = time.monotonic()
        self._stopping = True
        if self._process.returncode is None:
            await self._signal_then_kill(grace_s, reap_s)
        return await self._conclude(started)

    async def _signal_then_kill(self, term_grace_s: float, reap_s: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._process.terminate()
        if not await self._exited_within(term_grace_s):
            logger.warning(
                "model host %s ignored SIGTERM for %.1fs; SIGKILL", self.deployment_id, term_grace_s
            )
            self._kill()
            await self._exited_within(reap_s)

    async def _conclude(self, started: float) -> worker_gateway_pb2.UnloadEvidence:
        """After the signals: collect what the child wrote, close the channel, and say (one line)
        whether it is gone and how long its stop took."""
        if self._process.returncode is not None and self._response_task is not None:
            # The child is gone, so its end of the channel is closed: read what it wrote before
            # exiting (a HostUnloaded) up to the EOF before closing ours.
            await asyncio.wait({self._response_task}, timeout=_CHANNEL_CLOSED_GRACE_S)
        await self._close_channel()
        return self._record_stop(started)

    async def kill(self) -> worker_gateway_pb2.UnloadEvidence:
        """End the child now (SIGKILL, no Shutdown asked first) and reap it, as `stop` reports:
        for work its owner cancelled, where waiting for a polite exit helps nobody."""
        self._stopping = True
        self._kill()
        await self._exited_within(_KILL_GRACE_S)
        return await self.stop(grace_s=0)

    @property
    def unloaded(self) -> model_host_pb2.HostUnloaded | None:
        """The child's HostUnloaded answer to Shutdown, if it gave one before exiting."""
        return self._unloaded

    def kill_unresponsive(self, why: str) -> None:
        """The host missed a liveness deadline: fail its callers now and SIGKILL it.

        Its exit still reaches `on_exit`, so the owner restarts it; `unresponsive` tells why.
        """
        if self._unresponsive is not None or self._process.returncode is not None:
            return
        self._unresponsive = GantryError(
            "RUNTIME_UNRESPONSIVE",
            f"model host {self.deployment_id!r} (pid {self.pid}) is unresponsive: {why}",
            deployment_id=self.deployment_id,
            pid=str(self.pid),
        )
        logger.error("%s; killing it", self._unresponsive.message)
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(self._unresponsive)
        self._kill()

    # -- state ---------------------------------------------------------------------------------

    @property
    def ready(self) -> model_host_pb2.HostReady:
        assert self._ready is not None, "ModelHost is only handed out once ready"
        return self._ready

    @property
    def isolation(self) -> Isolation:
        """The sandbox the child reported; NONE when it did not say (a host that predates it)."""
        return sandbox.reported_isolation(self.ready.isolation, self.ready.isolation_reason)

    @property
    def deployment_id(self) -> str:
        return self._spec.deployment_id

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def stderr_tail(self) -> list[str]:
        return self._stderr.lines()

    # -- internals -----------------------------------------------------------------------------

    async def _send(self, request: model_host_pb2.HostRequest) -> None:
        await self._frames.send(request)

    async def _call(
        self,
        request: model_host_pb2.HostRequest,
        *,
        timeout_s: float,
        queue_timeout: bool = True,
        on_progress: OnProgress | None = None,
    ) -> model_host_pb2.HostResponse:
        """Send one request and wait for its answer, at most `timeout_s`; `on_progress` gets the
        frames that come before the answer (a generation's deltas).

        The child learns the timeout too (`timeout_ms`), so work still queued there past it is
        never run; a caller that gives up (timeout or cancellation) sends a CancelRequest.
        """
        self._check_serving()
        if len(self._pending) >= self._spec.max_pending:
            raise GantryError(
                "QUEUE_FULL",
                f"model host {self.deployment_id!r} already has {len(self._pending)} requests "
                "pending",
                deployment_id=self.deployment_id,
            )
        request_id = next(self._request_ids)
        request.request_id = request_id
        if queue_timeout:
            request.timeout_ms = max(1, int(timeout_s * 1000))
        future: asyncio.Future[model_host_pb2.HostResponse] = (
            asyncio.get_running_loop().create_future()
        )
        self._pending[request_id] = future
        if on_progress is not None:
            self._progress[request_id] = on_progress
        answered = False
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    await self._send(request)
                except (OSError, FrameError) as exc:
                    if isinstance(exc, FrameError):
                        raise GantryError("INVALID_PAYLOAD", str(exc)) from exc
                    # The child is going away; the exit watcher fails the future with the cause.
                    logger.debug("send to model host %s failed: %s", self.deployment_id, exc)
                response = await future
                answered = True
                return response
        except TimeoutError as exc:
            raise GantryError(
                "DEADLINE_EXCEEDED",
                f"model host {self.deployment_id!r} did not answer within {timeout_s:g}s",
                deployment_id=self.deployment_id,
            ) from exc
        finally:
            self._pending.pop(request_id, None)
            self._progress.pop(request_id, None)
            # Not answered by the child (a timeout, or our caller's cancellation, which also
            # cancels the awaited future): the child may still hold it queued.
            gave_up = not future.done() or future.cancelled()
            if not answered and gave_up and request.WhichOneof("kind") != "ping":
                self._cancel_in_child(request_id)

    def _cancel_in_child(self, request_id: int) -> None:
        """Tell the child to drop a request nobody waits for (it may still be queued there)."""
        if self._process.returncode is not None or self._stopping or self._unresponsive:
            return
        cancel = model_host_pb2.HostRequest(
            cancel=model_host_pb2.CancelRequest(request_id=request_id)
        )

        async def send_cancel() -> None:
            with contextlib.suppress(OSError, FrameError):
                await asyncio.wait_for(self._send(cancel), _SHUTDOWN_SEND_S)

        # Runs on its own: the caller may be a cancelled task that must not await anything.
        task = asyncio.get_running_loop().create_task(send_cancel())
        self._cancel_sends.add(task)
        task.add_done_callback(self._cancel_sends.discard)

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._process.kill()

    async def _load(self, trace_context: Mapping[str, str]) -> model_host_pb2.HostReady:
        spec = self._spec
        await self._send(
            model_host_pb2.HostRequest(
                request_id=0,
                trace_context=dict(trace_context),
                load=model_host_pb2.HostLoad(
                    deployment_id=spec.deployment_id,
                    model_directory=str(spec.model_directory),
                    adapter=spec.adapter,
                    require_isolation=spec.require_isolation.wire,
                ),
            )
        )
        try:
            response = await self._read_answer()
        except (FrameError, DecodeError, OSError) as exc:
            raise await self._load_error_after_exit(f"broken channel during load: {exc}") from exc
        if response is None:
            raise await self._load_error_after_exit("exited before it was ready")
        kind = response.WhichOneof("kind")
        if kind == "ready":
            return response.ready
        if kind == "failure":
            # The child exits by itself after reporting; reap it so nothing outlives the failure.
            await self._exited_within(_EXIT_AFTER_FAILURE_S)
            error = GantryError.from_failure(response.failure)
            metadata = {**error.metadata, "deployment_id": self.deployment_id}
            raise GantryError(error.reason, error.message, **metadata)
        raise await self._load_error_after_exit(f"answered the load with {kind!r}")

    async def _read_answer(self) -> model_host_pb2.HostResponse | None:
        """The next frame that answers something (relayed spans go to export on the way)."""
        while (payload := await read_frame_async(self._reader)) is not None:
            response = model_host_pb2.HostResponse.FromString(payload)
            if response.WhichOneof("kind") != "spans":
                return response
            export_host_spans(response.spans, self.deployment_id)
        return None

    async def _load_error_after_exit(self, what: str) -> GantryError:
        await self._exited_within(_EXIT_AFTER_FAILURE_S)
        await self._stderr.settle()
        return self._load_error(
            f"model host for {self.deployment_id!r} {what} "
            f"({describe_returncode(self._process.returncode)})"
        )

    def _load_error(self, message: str) -> GantryError:
        tail = self._stderr.text()
        return GantryError(
            "LOAD_FAILED",
            f"{message}; stderr tail:\n{tail}" if tail else message,
            deployment_id=self.deployment_id,
        )

    async def _abandon(self) -> None:
        """A failed or cancelled start: the child must not outlive it."""
        self._stopping = True
        if self._process.returncode is None:
            self._kill()
        await self._exited_within(_KILL_GRACE_S)
        await self._close_channel()

    async def _exited_within(self, timeout_s: float) -> bool:
        if self._process.returncode is not None:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._process.wait()), timeout_s)
        return self._process.returncode is not None

    async def _close_channel(self) -> None:
        self._frames.flush()
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()
        if self._exit_task is not None and self._process.returncode is not None:
            # Let the watcher finish: it fails whatever is still pending with the cause.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exit_task), _KILL_GRACE_S)
        for task in (self._response_task, self._exit_task):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._stderr.settle()
        self._remove_private_dir()

    def _exit_error(self) -> GantryError:
        return crashed_error(
            "model host",
            deployment_id=self.deployment_id,
            pid=self.pid,
            returncode=self._process.returncode,
            output=self._stderr.lines(),
            output_name="stderr",
        )

    async def _dispatch_responses(self) -> None:
        try:
            while (response := await self._read_answer()) is not None:
                kind = response.WhichOneof("kind")
                if kind == "unloaded":
                    self._unloaded = response.unloaded  # answers Shutdown, which nobody awaits
                    continue
                if kind == "generate_delta":
                    self._progressed(response)  # not an answer: the request stays pending
                    continue
                future = self._pending.pop(response.request_id, None)
                # None or done: the caller timed out or was cancelled; the answer has no taker.
                if future is not None and not future.done():
                    future.set_result(response)
        except (FrameError, DecodeError, OSError) as exc:
            logger.error("model host %s channel broken: %s", self.deployment_id, exc)
        # A child without a channel is useless: make sure it exits, so the exit watcher fails
        # every pending call with the real cause.
        if not await self._exited_within(_CHANNEL_CLOSED_GRACE_S):
            logger.error("model host %s closed its channel but kept running; killing it", self.pid)
            self._kill()

    def _progressed(self, response: model_host_pb2.HostResponse) -> None:
        on_progress = self._progress.get(response.request_id)
        if on_progress is None:
            return  # the caller gave up; the child stops when it reads the CancelRequest
        try:
            on_progress(response)
        except Exception:
            # The caller's own fault: it must not end this reader and with it every caller.
            logger.exception("progress of request %d was not taken", response.request_id)

    async def _watch_exit(self) -> int:
        returncode = await self._process.wait()
        await self._stderr.settle()
        error: GantryError
        if self._unresponsive is not None:
            error = self._unresponsive
        elif self._stopping:
            error = GantryError(
                "DEPLOYMENT_NOT_READY",
                f"model host {self.deployment_id!r} was stopped while the request was pending",
                deployment_id=self.deployment_id,
            )
        else:
            error = self._exit_error()
            logger.error("%s", error.message)
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        if not self._stopping and self._on_exit is not None:
            try:
                self._on_exit(self, returncode)
            except Exception:
                logger.exception("on_exit callback for model host %s failed", self.deployment_id)
        return returncode


async def _end_unconnected(process: HostProcess, stderr: StderrTail, private_dir: Path) -> bool:
    """Kill a child whose start ended before its channel opened, and wait (at most
    `_KILL_GRACE_S`, a second cancellation aside) for its reap; its private directory goes once
    it is reaped. Whether it is gone."""
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(process.wait()), _KILL_GRACE_S)
    if process.returncode is None:
        return False
    await stderr.settle()
    shutil.rmtree(private_dir, ignore_errors=True)
    return True


async def _start_child(
    spec: HostLaunchSpec,
    *,
    environment: Mapping[str, str],
    private_dir: Path,
    parent_end: socket.socket,
    child_end: socket.socket,
    warm_pool: WarmPool | None,
) -> HostProcess:
    """The child, spawned or forked by `warm_pool`, holding `child_end`. When it cannot be
    started (or the start is cancelled) `parent_end` is closed and `private_dir` removed before
    this raises; `child_end` is closed either way."""
    try:
        if warm_pool is not None:
            return await warm_pool.fork_host(
                python_executable=spec.python_executable,
                environment=environment,
                deployment_id=spec.deployment_id,
                private_dir=private_dir,
                inbox_limit=spec.inbox_limit,
                channel=child_end,
                timeout_s=spec.load_timeout_s,
            )
        return await SpawnedProcess.spawn(
            spec.python_executable,
            deployment_id=spec.deployment_id,
            inbox_limit=spec.inbox_limit,
            channel=child_end,
            private_dir=private_dir,
            environment=environment,
        )
    except OSError as exc:
        parent_end.close()
        shutil.rmtree(private_dir, ignore_errors=True)
        raise GantryError(
            "RUNTIME_ENVIRONMENT_UNAVAILABLE",
            f"cannot start a model host with {spec.python_executable!r}: {exc}",
            deployment_id=spec.deployment_id,
        ) from exc
    except BaseException:
        parent_end.close()
        shutil.rmtree(private_dir, ignore_errors=True)
        raise
    finally:
        # Only the child may hold its end, or we would never see EOF when it dies.
        child_end.close()

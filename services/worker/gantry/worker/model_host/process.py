"""The worker's seam to one model host child: spawn, await ready, multiplex embeds, stop, verify."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import signal
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import DecodeError

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2, model_host_pb2, worker_gateway_pb2
from gantry.worker.model_host.environments import OFFLINE_ENVIRONMENT
from gantry.worker.model_host.framing import FrameError, read_frame_async, write_frame_async

logger = logging.getLogger("gantry.worker.model_host")

CHILD_MODULE = "gantry.worker.model_host.child"
STDERR_TAIL_LINES = 50
_STDERR_CHUNK_BYTES = 64 * 1024
# Bounds on waits that only collect evidence; none of them delays an answer to a caller.
_EXIT_AFTER_FAILURE_S = 5.0
_STDERR_SETTLE_S = 0.5
_CHANNEL_CLOSED_GRACE_S = 1.0
_SHUTDOWN_SEND_S = 1.0
_TERM_GRACE_S = 5.0
_KILL_GRACE_S = 5.0

OnExit = Callable[["ModelHost", int], None]


@dataclass(frozen=True, kw_only=True)
class HostLaunchSpec:
    deployment_id: str
    model_directory: Path
    adapter: common_pb2.AdapterSettings
    python_executable: str
    env: Mapping[str, str] = field(default_factory=dict)
    load_timeout_s: float = 300.0


def describe_returncode(returncode: int | None) -> str:
    if returncode is None:
        return "no exit status"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def _process_start_ticks(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat: tells our child apart from a later process reusing its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; the fields after it start past its ')'.
    fields_after_name = stat[stat.rindex(")") + 2 :].split()
    return fields_after_name[19] if len(fields_after_name) > 19 else None


class _StderrTail:
    """Drains the child's stderr (a full pipe would block it), logs it, keeps the last lines."""

    def __init__(self, stream: asyncio.StreamReader, deployment_id: str) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._deployment_id = deployment_id
        self.task = asyncio.create_task(
            self._drain(stream), name=f"model-host-stderr-{deployment_id}"
        )

    def lines(self) -> list[str]:
        return list(self._lines)

    def text(self) -> str:
        return "\n".join(self._lines)

    async def settle(self) -> None:
        """Give the last lines of an exiting child a moment to arrive."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.task), _STDERR_SETTLE_S)

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        partial = b""
        while chunk := await stream.read(_STDERR_CHUNK_BYTES):
            *complete, partial = (partial + chunk).split(b"\n")
            for line in complete:
                self._record(line)
            if len(partial) > _STDERR_CHUNK_BYTES:
                self._record(partial)
                partial = b""
        if partial:
            self._record(partial)

    def _record(self, raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip()
        if line:
            self._lines.append(line)
            logger.info("model-host %s: %s", self._deployment_id, line)


class ModelHost:
    """One running model host child. Create with `await ModelHost.start(spec)`.

    After an unexpected exit (reported to `on_exit`) the host answers RUNTIME_CRASHED; the owner
    still calls `stop()`, which closes the channel and returns the exit evidence.
    """

    def __init__(
        self,
        *,
        spec: HostLaunchSpec,
        process: asyncio.subprocess.Process,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        stderr: _StderrTail,
        on_exit: OnExit | None,
    ) -> None:
        self._spec = spec
        self._process = process
        self._reader = reader
        self._writer = writer
        self._stderr = stderr
        self._on_exit = on_exit
        self._start_ticks = _process_start_ticks(process.pid)
        self._ready: model_host_pb2.HostReady | None = None
        self._pending: dict[int, asyncio.Future[model_host_pb2.HostResponse]] = {}
        self._request_ids = itertools.count(1)
        self._write_lock = asyncio.Lock()
        self._stopping = False
        self._evidence: worker_gateway_pb2.UnloadEvidence | None = None
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
    ) -> ModelHost:
        """Spawn the child and wait until it has loaded and health-checked the model.

        Raises GantryError: the child's own failure (LOAD_FAILED, HEALTH_FAILED), LOAD_FAILED when
        it dies or times out first, RUNTIME_ENVIRONMENT_UNAVAILABLE when it cannot be spawned. The
        child never outlives a failed or cancelled start.
        """
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = await asyncio.create_subprocess_exec(
                spec.python_executable,
                "-m",
                CHILD_MODULE,
                "--deployment-id",
                spec.deployment_id,
                "--parent-pid",
                str(os.getpid()),
                "--channel-fd",
                str(child_end.fileno()),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(child_end.fileno(),),
                env={**os.environ, **spec.env, **OFFLINE_ENVIRONMENT},
            )
        except OSError as exc:
            parent_end.close()
            raise GantryError(
                "RUNTIME_ENVIRONMENT_UNAVAILABLE",
                f"cannot start a model host with {spec.python_executable!r}: {exc}",
                deployment_id=spec.deployment_id,
            ) from exc
        finally:
            # Only the child may hold its end, or we would never see EOF when it dies.
            child_end.close()
        assert process.stderr is not None
        stderr = _StderrTail(process.stderr, spec.deployment_id)
        try:
            reader, writer = await asyncio.open_unix_connection(sock=parent_end)
        except BaseException:
            process.kill()
            parent_end.close()
            raise
        host = cls(
            spec=spec,
            process=process,
            reader=reader,
            writer=writer,
            stderr=stderr,
            on_exit=on_exit,
        )
        try:
            async with asyncio.timeout(spec.load_timeout_s):
                host._ready = await host._load(trace_context or {})
        except BaseException as exc:
            await host._abandon()
            if isinstance(exc, TimeoutError):
                raise host._load_error(
                    f"model host for {spec.deployment_id!r} was not ready within "
                    f"{spec.load_timeout_s:g}s"
                ) from exc
            raise
        host._response_task = asyncio.create_task(
            host._dispatch_responses(), name=f"model-host-responses-{spec.deployment_id}"
        )
        host._exit_task = asyncio.create_task(
            host._watch_exit(), name=f"model-host-exit-{spec.deployment_id}"
        )
        logger.info(
            "model host %s ready: pid=%d dim=%d load_seconds=%.2f",
            spec.deployment_id,
            host.pid,
            host.ready.dim,
            host.ready.load_seconds,
        )
        return host

    async def stop(self, *, grace_s: float = 10.0) -> worker_gateway_pb2.UnloadEvidence:
        """Ask the child to exit, escalate to SIGTERM then SIGKILL, and report whether it is gone.

        `process_exited` is True only when the child was reaped and its pid no longer names it.
        """
        if self._evidence is not None:
            return self._evidence
        self._stopping = True
        if self._process.returncode is None:
            with contextlib.suppress(OSError, FrameError, TimeoutError):
                await asyncio.wait_for(
                    self._send(model_host_pb2.HostRequest(shutdown=model_host_pb2.Shutdown())),
                    _SHUTDOWN_SEND_S,
                )
            if not await self._exited_within(grace_s):
                logger.warning("model host %s ignored Shutdown; SIGTERM", self.deployment_id)
                with contextlib.suppress(ProcessLookupError):
                    self._process.terminate()
                if not await self._exited_within(_TERM_GRACE_S):
                    logger.warning("model host %s ignored SIGTERM; SIGKILL", self.deployment_id)
                    with contextlib.suppress(ProcessLookupError):
                        self._process.kill()
                    await self._exited_within(_KILL_GRACE_S)
        await self._close_channel()
        returncode = self._process.returncode
        self._evidence = worker_gateway_pb2.UnloadEvidence(
            pid=self.pid,
            process_exited=self._confirmed_gone(),
            exit_code=returncode if returncode is not None else 0,
        )
        logger.info(
            "model host %s stopped: pid=%d %s exited=%s",
            self.deployment_id,
            self.pid,
            describe_returncode(returncode),
            self._evidence.process_exited,
        )
        return self._evidence

    # -- serving -------------------------------------------------------------------------------

    async def embed(
        self, inputs: Sequence[str], *, trace_context: Mapping[str, str], timeout_s: float
    ) -> worker_gateway_pb2.EmbedResult:
        """Embed `inputs` in the child. Raises GantryError: INVALID_PAYLOAD, INVOKE_FAILED,
        RUNTIME_CRASHED (the child died meanwhile), DEADLINE_EXCEEDED, DEPLOYMENT_NOT_READY."""
        if not inputs:
            raise GantryError("INVALID_PAYLOAD", "an embed request needs at least one input")
        self._check_serving()
        request_id = next(self._request_ids)
        future: asyncio.Future[model_host_pb2.HostResponse] = (
            asyncio.get_running_loop().create_future()
        )
        self._pending[request_id] = future
        request = model_host_pb2.HostRequest(
            request_id=request_id,
            trace_context=dict(trace_context),
            embed=worker_gateway_pb2.EmbedPayload(inputs=list(inputs)),
        )
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
        except TimeoutError as exc:
            raise GantryError(
                "DEADLINE_EXCEEDED",
                f"model host {self.deployment_id!r} did not answer within {timeout_s:g}s",
                deployment_id=self.deployment_id,
            ) from exc
        finally:
            self._pending.pop(request_id, None)
        return self._embed_result(response, len(inputs))

    # -- state ---------------------------------------------------------------------------------

    @property
    def ready(self) -> model_host_pb2.HostReady:
        assert self._ready is not None, "ModelHost is only handed out once ready"
        return self._ready

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def deployment_id(self) -> str:
        return self._spec.deployment_id

    @property
    def alive(self) -> bool:
        return self._process.returncode is None and not self._stopping

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    def stderr_tail(self) -> list[str]:
        return self._stderr.lines()

    # -- internals -----------------------------------------------------------------------------

    async def _send(self, request: model_host_pb2.HostRequest) -> None:
        async with self._write_lock:
            await write_frame_async(self._writer, request)

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
                ),
            )
        )
        try:
            payload = await read_frame_async(self._reader)
            response = (
                model_host_pb2.HostResponse.FromString(payload) if payload is not None else None
            )
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
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
        await self._exited_within(_KILL_GRACE_S)
        await self._close_channel()

    async def _exited_within(self, timeout_s: float) -> bool:
        if self._process.returncode is not None:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._process.wait()), timeout_s)
        return self._process.returncode is not None

    async def _close_channel(self) -> None:
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

    def _confirmed_gone(self) -> bool:
        if self._process.returncode is None:
            return False
        # Reaped by us, so /proc/<pid> is either absent or a different process that reused the pid.
        current_ticks = _process_start_ticks(self.pid)
        return current_ticks is None or current_ticks != self._start_ticks

    def _check_serving(self) -> None:
        if self._stopping:
            raise GantryError(
                "DEPLOYMENT_NOT_READY",
                f"model host {self.deployment_id!r} is stopping",
                deployment_id=self.deployment_id,
            )
        if self._process.returncode is not None:
            raise self._crashed_error()

    def _crashed_error(self) -> GantryError:
        tail = "\n".join(self._stderr.lines()[-10:])
        message = (
            f"model host {self.deployment_id!r} (pid {self.pid}) exited with "
            f"{describe_returncode(self._process.returncode)}"
        )
        return GantryError(
            "RUNTIME_CRASHED",
            f"{message}; stderr tail:\n{tail}" if tail else message,
            deployment_id=self.deployment_id,
            pid=str(self.pid),
        )

    def _embed_result(
        self, response: model_host_pb2.HostResponse, input_count: int
    ) -> worker_gateway_pb2.EmbedResult:
        kind = response.WhichOneof("kind")
        if kind == "failure":
            raise GantryError.from_failure(response.failure)
        if kind != "embed":
            raise GantryError("INVOKE_FAILED", f"model host answered an embed with {kind!r}")
        result = response.embed
        if (
            result.count != input_count
            or result.dim != self.ready.dim
            or len(result.float32_le) != result.count * result.dim * 4
        ):
            raise GantryError(
                "INVOKE_FAILED",
                f"model host answered {result.count}x{result.dim} with {len(result.float32_le)} "
                f"bytes for {input_count} inputs of width {self.ready.dim}",
            )
        return result

    async def _dispatch_responses(self) -> None:
        try:
            while (payload := await read_frame_async(self._reader)) is not None:
                response = model_host_pb2.HostResponse.FromString(payload)
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
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()

    async def _watch_exit(self) -> int:
        returncode = await self._process.wait()
        await self._stderr.settle()
        if self._stopping:
            error = GantryError(
                "DEPLOYMENT_NOT_READY",
                f"model host {self.deployment_id!r} was stopped while the request was pending",
                deployment_id=self.deployment_id,
            )
        else:
            error = self._crashed_error()
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

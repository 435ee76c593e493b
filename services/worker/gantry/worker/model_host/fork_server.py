"""A warm pool's fork server: the wire between it and the worker, and the forking of one host.

The server has imported the ML stack once and never runs a torch op (OpenMP is not fork-safe once
used), so a host forked from it starts with its imports done. Each host is forked twice: the
intermediate child forks the host and exits at once, so the kernel reparents the host to the
worker, which is its children's subreaper (`hardening.become_child_subreaper`). The worker is
then the host's parent, as for a spawned host: it reaps it, and the host's parent-death signal
names it. The server reaps only the intermediate child and answers the host's pid.

One request at a time on a SOCK_SEQPACKET pair (a message is never split or merged): a JSON
request of at most `MAX_MESSAGE_BYTES` carrying the host's arguments and its whole environment,
with exactly two descriptors attached (SCM_RIGHTS): the host's end of its channel and the write
end of its stderr pipe. Every answer is one JSON message. Importing this module imports nothing
heavy: the worker imports it for the protocol.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("gantry.fork_server")

MAX_MESSAGE_BYTES = 64 * 1024
MAX_ENVIRONMENT_ENTRIES = 256
REQUEST_FDS = 2  # the host's channel end, then the write end of its stderr pipe
# A host waits this long for the kernel to hand it to the worker after its intermediate exits.
REPARENT_TIMEOUT_S = 5.0
_REPARENT_POLL_S = 0.0005
EXIT_HOST_CRASHED = 1


class ForkProtocolError(ValueError):
    """A message that breaks the protocol: too large, malformed, or with the wrong descriptors."""


@dataclass(frozen=True, kw_only=True)
class ForkRequest:
    """One host to fork: the arguments a spawned host gets on its command line, and its env."""

    deployment_id: str
    parent_pid: int
    private_dir: str
    inbox_limit: int
    environment: Mapping[str, str]

    def encode(self) -> bytes:
        message = json.dumps(
            {
                "deployment_id": self.deployment_id,
                "parent_pid": self.parent_pid,
                "private_dir": self.private_dir,
                "inbox_limit": self.inbox_limit,
                "environment": dict(self.environment),
            }
        ).encode()
        if len(message) > MAX_MESSAGE_BYTES:
            raise ForkProtocolError(
                f"a fork request of {len(message)} bytes exceeds {MAX_MESSAGE_BYTES}"
            )
        return message

    @classmethod
    def decode(cls, message: bytes) -> ForkRequest:
        fields = _json_object(message)
        environment = fields.get("environment")
        if (
            not isinstance(environment, dict)
            or len(environment) > MAX_ENVIRONMENT_ENTRIES
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in environment.items())
        ):
            raise ForkProtocolError("environment must be an object of at most 256 strings")
        try:
            request = cls(
                deployment_id=_typed(fields, "deployment_id", str),
                parent_pid=_typed(fields, "parent_pid", int),
                private_dir=_typed(fields, "private_dir", str),
                inbox_limit=_typed(fields, "inbox_limit", int),
                environment=environment,
            )
        except TypeError as exc:
            raise ForkProtocolError(str(exc)) from exc
        if request.parent_pid <= 1 or request.inbox_limit <= 0 or not request.deployment_id:
            raise ForkProtocolError("parent_pid, inbox_limit and deployment_id must be set")
        if not os.path.isabs(request.private_dir):
            raise ForkProtocolError("private_dir must be an absolute path")
        return request


def encode_reply(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def decode_reply(message: bytes) -> dict[str, Any]:
    """A server message: {"kind": "ready"|"failed"|"forked"|"refused", ...}."""
    fields = _json_object(message)
    if not isinstance(fields.get("kind"), str):
        raise ForkProtocolError("a fork server message needs a kind")
    return fields


def _json_object(message: bytes) -> dict[str, Any]:
    if len(message) > MAX_MESSAGE_BYTES:
        raise ForkProtocolError(f"a message of {len(message)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        fields = json.loads(message)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ForkProtocolError(f"not JSON: {exc}") from exc
    if not isinstance(fields, dict):
        raise ForkProtocolError("a message must be a JSON object")
    return fields


def _typed(fields: Mapping[str, Any], name: str, kind: type) -> Any:
    value = fields.get(name)
    # bool is an int to isinstance; no field here is a bool.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{name} must be a {kind.__name__}")
    return value


# -- the server (runs in the fork server process) -----------------------------------------------


def serve(control: socket.socket, *, worker_pid: int) -> int:
    """Answer fork requests until the worker closes its end; the exit status of the server."""
    while True:
        try:
            message, fds, flags, _ = socket.recv_fds(control, MAX_MESSAGE_BYTES, REQUEST_FDS)
        except OSError as exc:
            logger.error("fork server: the worker's socket failed: %s", exc)
            return 1
        if not message and not fds:
            return 0  # the worker closed its end: nothing more to fork
        try:
            reply = _fork_one(message, fds, flags, control=control, worker_pid=worker_pid)
        finally:
            for fd in fds:
                os.close(fd)
        try:
            control.send(reply)
        except OSError as exc:
            logger.error("fork server: cannot answer the worker: %s", exc)
            return 1


def _fork_one(
    message: bytes, fds: list[int], flags: int, *, control: socket.socket, worker_pid: int
) -> bytes:
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ForkProtocolError("a truncated fork request (too large, or too many fds)")
        if len(fds) != REQUEST_FDS:
            raise ForkProtocolError(f"a fork request carries {REQUEST_FDS} fds, not {len(fds)}")
        request = ForkRequest.decode(message)
        if request.parent_pid != worker_pid:
            raise ForkProtocolError(
                f"hosts of this server belong to pid {worker_pid}, not {request.parent_pid}"
            )
        pid = _double_fork(request, channel_fd=fds[0], stderr_fd=fds[1], control=control)
    except (ForkProtocolError, OSError) as exc:
        logger.error("fork server: refused a request: %s", exc)
        return encode_reply(kind="refused", error=str(exc))
    return encode_reply(kind="forked", pid=pid)


def _double_fork(
    request: ForkRequest, *, channel_fd: int, stderr_fd: int, control: socket.socket
) -> int:
    """Fork the host through an intermediate that exits at once; the host's pid once it is
    the worker's child (the intermediate is reaped before this returns)."""
    pid_read, pid_write = os.pipe()
    # Whatever is buffered would otherwise be written by every fork too.
    sys.stdout.flush()
    sys.stderr.flush()
    intermediate = os.fork()
    if intermediate == 0:  # the intermediate: fork the host, say its pid, exit
        code = 1
        try:
            os.close(pid_read)
            host = os.fork()
            if host == 0:
                os.close(pid_write)
                _become_host(request, channel_fd=channel_fd, stderr_fd=stderr_fd, control=control)
            os.write(pid_write, str(host).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(pid_write)
    try:
        with os.fdopen(pid_read, "rb") as pid_pipe:
            said = pid_pipe.read(32)
    finally:
        _, status = os.waitpid(intermediate, 0)
    if os.waitstatus_to_exitcode(status) != 0 or not said.isdigit():
        raise OSError(f"the intermediate child failed ({os.waitstatus_to_exitcode(status)})")
    # The intermediate is reaped, so it has exited, and the kernel reparented the host before
    # that: the host is the worker's child now (or a zombie of it), its pid held until reaped.
    return int(said)


def _become_host(
    request: ForkRequest, *, channel_fd: int, stderr_fd: int, control: socket.socket
) -> None:
    """In the forked host: take the spawned host's shape, then run the same code. Never returns."""
    code = EXIT_HOST_CRASHED
    try:
        os.dup2(stderr_fd, 2)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)  # and child.run_host sends stdout on to stderr, as spawned
        # Detached, so nothing in this process closes the number again once it is reused.
        control.detach()
        _close_inherited_fds(keep=channel_fd)
        # Wholesale: the server's own HOME and TMPDIR are not the host's; nothing else stays.
        os.environ.clear()
        os.environ.update(request.environment)
        tempfile.tempdir = None  # cached by an import in the server; read TMPDIR again
        os.chdir(request.private_dir)
        _await_reparenting(request.parent_pid)

        from gantry.worker.model_host.child import HostArguments, run_host

        code = run_host(
            HostArguments(
                deployment_id=request.deployment_id,
                parent_pid=request.parent_pid,
                channel_fd=channel_fd,
                private_dir=Path(request.private_dir),
                inbox_limit=request.inbox_limit,
            )
        )
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else EXIT_HOST_CRASHED
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):  # exiting anyway: nothing left to tell
                stream.flush()
        # Never unwind into the server's code (its loop, its atexit handlers).
        os._exit(code)


def _close_inherited_fds(*, keep: int) -> None:
    """Close every descriptor from the server but stdio and the channel."""
    limit = os.sysconf("SC_OPEN_MAX")
    os.closerange(3, keep)
    os.closerange(keep + 1, limit)


def _await_reparenting(worker_pid: int) -> None:
    """Wait until the kernel made the worker our parent, so parent-death can name it.

    Arming the parent-death signal earlier would fire it when the intermediate exits. A worker
    that died meanwhile is never our parent: exit as an orphan.
    """
    from gantry.worker.model_host.hardening import EXIT_ORPHANED

    deadline = time.monotonic() + REPARENT_TIMEOUT_S
    while os.getppid() != worker_pid:
        if time.monotonic() > deadline:
            os._exit(EXIT_ORPHANED)
        time.sleep(_REPARENT_POLL_S)

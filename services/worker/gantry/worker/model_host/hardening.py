"""Hardening of the model host child process: dies with its parent, no network, clean stdout."""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import sys
from collections.abc import Mapping
from typing import Any

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

# Exit status when the parent was already gone by the time the parent-death signal was armed.
EXIT_ORPHANED = 4

_GUARD_MARK = "_gantry_network_guard"


class NetworkDisabledError(ConnectionRefusedError):
    """Raised for any attempt to reach the network from a model host."""


def die_with_parent(parent_pid: int) -> None:
    """Arm SIGKILL on parent death, then exit at once if the parent died before it was armed.

    The signal fires when the *thread* that forked us exits; the worker spawns from its event loop
    thread, which lives as long as the worker does.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(code)}")
    if os.getppid() != parent_pid:
        os._exit(EXIT_ORPHANED)


def become_child_subreaper() -> None:
    """Make this process the reaper of its orphaned descendants (a worker using a warm pool).

    A host forked by a fork server is a grandchild; once the intermediate process exits, the
    kernel hands it to the nearest subreaper ancestor, so the worker stays the parent that reaps
    it and the host's parent-death signal names the worker. Descendants started before this
    call are covered too (the kernel propagates the flag); it is never turned off again.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(code)}")


def redirect_stdout_to_stderr() -> None:
    """ML libraries print to stdout; send it to stderr, which the parent captures and logs."""
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), 1)
    sys.stdout = sys.stderr


def apply_environment(variables: Mapping[str, str]) -> None:
    """Set variables that libraries read at import time; call before importing any of them."""
    os.environ.update(variables)


def install_network_guard() -> None:
    """Refuse every connection that is not a local (AF_UNIX) socket, whichever library tries it.

    Idempotent: a host forked from a fork server already has the server's guard.
    """
    if getattr(socket.socket.connect, _GUARD_MARK, False):
        return
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def refuse(address: Any) -> NetworkDisabledError:
        return NetworkDisabledError(
            errno.ECONNREFUSED, f"network access is disabled in the model host (to {address!r})"
        )

    def guarded_connect(self: socket.socket, address: Any) -> None:
        if self.family != socket.AF_UNIX:
            raise refuse(address)
        real_connect(self, address)

    def guarded_connect_ex(self: socket.socket, address: Any) -> int:
        if self.family != socket.AF_UNIX:
            raise refuse(address)
        return real_connect_ex(self, address)

    def guarded_create_connection(address: Any, *args: Any, **kwargs: Any) -> socket.socket:
        # create_connection only ever opens internet sockets.
        raise refuse(address)

    setattr(guarded_connect, _GUARD_MARK, True)
    socket.socket.connect = guarded_connect  # type: ignore[method-assign,assignment]
    socket.socket.connect_ex = guarded_connect_ex  # type: ignore[method-assign,assignment]
    socket.create_connection = guarded_create_connection  # type: ignore[assignment]

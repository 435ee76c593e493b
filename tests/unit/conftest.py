"""Unit tests stay hermetic: a unit test that opens a network socket or starts a process fails.

tests/unit is the fast suite: pure decisions, parsers, renderers and in-memory fakes. A test that
binds a port, connects to a server or spawns a process belongs in tests/integration, where its
cost and its flakiness are expected. The guard below enforces that line instead of leaving it to
review.

The guard is an autouse, function-scoped fixture that monkeypatches the process-wide entry points
for the duration of one unit test (its function-scoped fixtures included), so nothing leaks into
tests/integration when both directories run in one session. Higher-scoped fixtures are set up
before it and are not guarded; none in tests/unit does IO.

What it refuses:
- a network socket: `connect`/`connect_ex`/`bind` on an AF_INET or AF_INET6 socket, and a gRPC
  server port or channel whose address is not `unix:` (gRPC's C core opens its sockets itself,
  past Python's socket module). AF_UNIX stays allowed: every asyncio event loop makes a socketpair
  for its self-pipe.
- a process: `subprocess.Popen` (and so `run`, `check_output`, asyncio's subprocesses, `os.popen`)
  by way of `Popen._execute_child`, which every spawn goes through even when a module imported
  `Popen` by name; `asyncio.create_subprocess_exec`/`_shell`; `os.fork`, `os.forkpty`,
  `os.posix_spawn[p]`, `os.spawn*`, `os.system`; and starting a `multiprocessing` process (which
  `ProcessPoolExecutor` and `multiprocessing.Pool` do too).

A refused call raises `UnitTestIOError` and is also recorded: a test that catches the error (a
retry loop's `except Exception`, say) still fails, with a report naming each refused call.
"""

from __future__ import annotations

import asyncio
import multiprocessing.process
import os
import socket
import subprocess
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc._channel
import grpc._server
import grpc.aio._channel
import grpc.aio._server
import pytest

NETWORK_FAMILIES = (socket.AF_INET, socket.AF_INET6)

# The os functions that create a process without going through subprocess.Popen.
OS_SPAWNERS = (
    "fork",
    "forkpty",
    "posix_spawn",
    "posix_spawnp",
    "spawnl",
    "spawnle",
    "spawnlp",
    "spawnlpe",
    "spawnv",
    "spawnve",
    "spawnvp",
    "spawnvpe",
    "system",
)

MOVE_HINT = "unit tests may not do network or process IO: move this test to tests/integration"


class UnitTestIOError(AssertionError):
    """A unit test opened a network socket or started a process."""


@dataclass
class IOGuard:
    """The calls the guard refused during one unit test, in order."""

    refused: list[str] = field(default_factory=list)
    reported: int = 0

    def refuse(self, what: str) -> UnitTestIOError:
        self.refused.append(what)
        return UnitTestIOError(f"{what}: {MOVE_HINT}")

    def forgive(self) -> list[str]:
        """Clear what was refused so far (for the guard's own tests) and return it."""
        refused, self.refused, self.reported = self.refused, [], 0
        return refused


_GUARD_KEY = pytest.StashKey[IOGuard]()


def _is_unix_address(address: str) -> bool:
    return address.startswith("unix:") or address.startswith("unix-abstract:")


def _patch_io_entry_points(monkeypatch: pytest.MonkeyPatch, guard: IOGuard) -> None:
    """Replace each entry point with one that refuses through `guard`; monkeypatch restores them."""

    def socket_call(name: str) -> Callable[..., Any]:
        original = getattr(socket.socket, name)

        def guarded(self: socket.socket, address: Any, *args: Any) -> Any:
            if self.family in NETWORK_FAMILIES:
                raise guard.refuse(f"socket.{name}({address!r})")
            return original(self, address, *args)

        return guarded

    for name in ("connect", "connect_ex", "bind"):
        monkeypatch.setattr(socket.socket, name, socket_call(name))

    def grpc_port(owner: type, name: str) -> None:
        original = getattr(owner, name)

        def guarded(self: Any, address: str, *args: Any, **kwargs: Any) -> Any:
            if not _is_unix_address(address):
                raise guard.refuse(f"gRPC server {name}({address!r})")
            return original(self, address, *args, **kwargs)

        monkeypatch.setattr(owner, name, guarded)

    for server in (grpc._server._Server, grpc.aio._server.Server):
        grpc_port(server, "add_insecure_port")
        grpc_port(server, "add_secure_port")

    def grpc_channel(owner: type) -> None:
        # Each channel class defines its own __init__: the one every way of making it runs.
        original: Callable[..., None] = vars(owner)["__init__"]

        def guarded(self: Any, target: str, *args: Any, **kwargs: Any) -> None:
            if not _is_unix_address(target):
                raise guard.refuse(f"gRPC channel to {target!r}")
            original(self, target, *args, **kwargs)

        monkeypatch.setattr(owner, "__init__", guarded)

    for channel in (grpc._channel.Channel, grpc.aio._channel.Channel):
        grpc_channel(channel)

    def execute_child(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        raise guard.refuse(f"subprocess.Popen({args!r})")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", execute_child)

    def asyncio_spawner(name: str) -> Callable[..., Any]:
        async def guarded(program: Any, *args: Any, **kwargs: Any) -> Any:
            raise guard.refuse(f"asyncio.{name}({program!r}, ...)")

        return guarded

    for name in ("create_subprocess_exec", "create_subprocess_shell"):
        monkeypatch.setattr(asyncio, name, asyncio_spawner(name))

    def os_spawner(name: str) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            raise guard.refuse(f"os.{name}{args!r}")

        return guarded

    for name in OS_SPAWNERS:
        if hasattr(os, name):
            monkeypatch.setattr(os, name, os_spawner(name))

    def process_start(self: multiprocessing.process.BaseProcess) -> None:
        raise guard.refuse(f"multiprocessing start of {self!r}")

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", process_start)


@pytest.fixture(autouse=True)
def io_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[IOGuard]:
    """Refuse network sockets and processes for the duration of this unit test."""
    guard = IOGuard()
    request.node.stash[_GUARD_KEY] = guard
    _patch_io_entry_points(monkeypatch, guard)
    yield guard


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A phase that passed although the guard refused a call in it fails, naming the calls.

    The refusal itself raises, but code under test may catch it; this makes sure it still counts.
    """
    report = yield
    guard = item.stash.get(_GUARD_KEY, None)
    if guard is None:
        return report
    refused, guard.reported = guard.refused[guard.reported :], len(guard.refused)
    if refused and report.passed:
        report.outcome = "failed"
        report.longrepr = "\n".join([f"{MOVE_HINT}; refused:", *(f"  {what}" for what in refused)])
    return report

"""The unit-test guard (tests/unit/conftest.py) refuses network sockets and processes.

Each test asserts the refusal itself, so it fails if the guard is removed or stops patching one
of these entry points; it then forgives what it provoked, so the guard does not fail it after.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading

import pytest

from tests.unit.conftest import IOGuard, UnitTestIOError


def test_a_tcp_connect_is_refused(io_guard: IOGuard) -> None:
    # Port 9 (discard) on the loopback: without the guard this is a ConnectionRefusedError.
    with pytest.raises(UnitTestIOError, match="move this test to tests/integration"):
        socket.create_connection(("127.0.0.1", 9), timeout=1)
    assert [what.startswith("socket.connect") for what in io_guard.forgive()] == [True]


def test_a_tcp_bind_is_refused(io_guard: IOGuard) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        with pytest.raises(UnitTestIOError):
            server.bind(("127.0.0.1", 0))
    assert io_guard.forgive() == ["socket.bind(('127.0.0.1', 0))"]


def test_popen_is_refused(io_guard: IOGuard) -> None:
    with pytest.raises(UnitTestIOError, match=r"subprocess\.Popen"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert len(io_guard.forgive()) == 1


def test_fork_is_refused(io_guard: IOGuard) -> None:
    with pytest.raises(UnitTestIOError, match=r"os\.fork"):
        # Without the guard: the child leaves at once rather than run the rest of the suite.
        if (child := os.fork()) == 0:
            os._exit(0)
        os.waitpid(child, 0)
    io_guard.forgive()


async def test_an_asyncio_subprocess_is_refused(io_guard: IOGuard) -> None:
    with pytest.raises(UnitTestIOError, match="create_subprocess_exec"):
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    io_guard.forgive()


def test_a_refusal_the_code_swallows_is_still_recorded(io_guard: IOGuard) -> None:
    # A retry loop's `except Exception` hides the error; the record is what fails such a test
    # (the makereport hook in tests/unit/conftest.py turns a passed phase with refusals into a
    # failure naming them).
    try:
        subprocess.run(["true"], check=False)
    except Exception:
        pass
    assert io_guard.forgive() == ["subprocess.Popen(['true'])"]


async def test_the_event_loop_still_runs(io_guard: IOGuard) -> None:
    # asyncio's self-pipe is an AF_UNIX socketpair: allowed, like any Unix socketpair.
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"x")
        assert right.recv(1) == b"x"
    # A callback from another thread wakes the loop through that self-pipe.
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[bool] = loop.create_future()
    threading.Thread(target=loop.call_soon_threadsafe, args=(woken.set_result, True)).start()
    assert await woken
    assert io_guard.refused == []

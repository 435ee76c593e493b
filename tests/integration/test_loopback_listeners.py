"""A managed server's listening sockets, read with psutil from a real process tree: its own and
its children's, never another process's in the same network namespace."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gantry.worker.managed_server.loopback import server_listeners

# A parent listening on 127.0.0.1 and a child listening on every address; the parent prints its
# port and its child's pid, then waits to be killed.
_TREE = """
import signal, socket, subprocess, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
child = subprocess.Popen([sys.executable, "-c",
    "import signal, socket; c = socket.socket(); c.bind(('0.0.0.0', 0)); c.listen();"
    "print(c.getsockname()[1], flush=True); signal.pause()"], stdout=subprocess.PIPE, text=True)
print(s.getsockname()[1], child.stdout.readline().strip(), flush=True)
signal.pause()
"""


@pytest.fixture
def tree() -> Iterator[tuple[int, int, int]]:
    process = subprocess.Popen(
        [sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert process.stdout is not None
        parent_port, child_port = (int(word) for word in process.stdout.readline().split())
        yield process.pid, parent_port, child_port
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_the_tree_s_own_sockets_are_found_and_a_wildcard_one_refused(
    tree: tuple[int, int, int],
) -> None:
    pid, parent_port, child_port = tree
    held, beyond = server_listeners(pid)
    assert sorted(s.port for s in held) == sorted([parent_port, child_port])
    assert [s.describe() for s in beyond] == [f"0.0.0.0:{child_port}"]


def test_another_process_s_wildcard_socket_is_not_the_server_s(
    tree: tuple[int, int, int],
) -> None:
    pid, _, child_port = tree
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as foreign:
        foreign.bind(("0.0.0.0", 0))  # this test's own socket, outside the tree
        foreign.listen()
        held, beyond = server_listeners(pid)
        assert foreign.getsockname()[1] not in {s.port for s in held}
    assert [s.port for s in beyond] == [child_port]


def test_a_process_that_is_gone_holds_nothing() -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert server_listeners(process.pid) == ([], [])

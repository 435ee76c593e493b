"""A sandboxed model host reaches no pathname Unix socket outside it (issue 26, item 8).

The real host (`child.main`) runs with one change: right after it enters its sandbox, and before
it reads the model, it tries to reach two listeners this test holds outside the sandbox - a stream
socket through a fresh `socket(2)` + `connect(2)`, and a datagram socket through one end of a
socketpair, re-connected or addressed in `sendto` (no `socket(2)`, no `connect(2)`: the socketpair
rule stops it) - and fails the
load with what the kernel answered. Landlock does not govern connecting to a pathname socket on
this kernel, so the seccomp filter is what refuses both.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gantry.worker.model_host.serving import TEST_HOOK_PROBE_MARKER
from tests.integration.test_model_host_sandbox import _kernel_seccomp, probe_after_sandbox

_CONNECT_AFTER_SANDBOX = """
import _socket, errno, json, sys
from gantry.common.errors import GantryError
from gantry.worker.model_host import child

def attempt(action):
    try:
        action()
    except OSError as exc:
        return f"{{type(exc).__name__}} {{errno.errorcode.get(exc.errno or 0, exc.errno)}}"
    return "allowed"

def stream_connect():
    # `_socket` directly: the kernel's answer, not the Python-level guard's.
    probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        probe.connect({stream_path!r})
    finally:
        probe.close()

def dgram_connect():
    end, other = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_DGRAM)
    try:
        end.connect({dgram_path!r})
        end.send(b"exfiltrated")
    finally:
        end.close()
        other.close()

def dgram_sendto():
    # No connect at all: a datagram pair end addresses the listener in the send itself.
    end, other = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_DGRAM)
    try:
        end.sendto(b"exfiltrated", {dgram_path!r})
    finally:
        end.close()
        other.close()

real_enter = child._enter_sandbox

def enter_then_probe(load, private_dir):
    isolation = real_enter(load, private_dir)
    report = {{
        "isolation": isolation.wire,
        "stream_connect": attempt(stream_connect),
        "dgram_connect": attempt(dgram_connect),
        "dgram_sendto": attempt(dgram_sendto),
    }}
    raise GantryError("LOAD_FAILED", {marker!r} + json.dumps(report))

child._enter_sandbox = enter_then_probe
sys.exit(child.main(sys.argv[1:]))
"""


@pytest.fixture
def unix_listeners(tmp_path: Path) -> Iterator[tuple[socket.socket, socket.socket]]:
    """A stream and a datagram listener on pathname sockets outside any sandbox, as a local
    database or a container daemon would hold them."""
    outside = tmp_path / "outside"
    outside.mkdir()
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stream,
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as dgram,
    ):
        stream.bind(str(outside / "daemon.sock"))
        stream.listen(8)
        stream.setblocking(False)
        dgram.bind(str(outside / "log.sock"))
        dgram.setblocking(False)
        yield stream, dgram


async def test_sandboxed_cpu_host_cannot_connect_to_a_pathname_unix_socket_outside_it(
    tiny_model_dir: Path, tmp_path: Path, unix_listeners: tuple[socket.socket, socket.socket]
) -> None:
    filtered, seccomp_reason = _kernel_seccomp()
    stream, dgram = unix_listeners
    code = _CONNECT_AFTER_SANDBOX.format(
        stream_path=stream.getsockname(),
        dgram_path=dgram.getsockname(),
        marker=TEST_HOOK_PROBE_MARKER,
    )
    report = await probe_after_sandbox(tiny_model_dir, tmp_path, code, "dep-unix")

    if not filtered:
        assert "+SECCOMP_NET" not in report["isolation"]
        pytest.skip(f"this kernel refuses the seccomp filter: {seccomp_reason}")
    assert report["isolation"].endswith("+SECCOMP_NET")
    assert report["stream_connect"] == "PermissionError EACCES"
    assert report["dgram_connect"] == "PermissionError EACCES"
    assert report["dgram_sendto"] == "PermissionError EACCES"
    # Both listeners are up: nothing arrived at either.
    with pytest.raises(BlockingIOError):
        stream.accept()
    with pytest.raises(BlockingIOError):
        dgram.recv(64)

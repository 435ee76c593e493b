"""The warm pool's wire to its fork server: bounded, typed, and refused whole when malformed.

The refusals run the real server loop (`fork_server.serve`) on a real socket pair in a thread;
none of them reaches a fork.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from gantry.worker.model_host.fork_server import (
    MAX_MESSAGE_BYTES,
    ForkProtocolError,
    ForkRequest,
    decode_reply,
    serve,
)
from gantry.worker.model_host.warm_pool import ServerKey


def _request(**overrides: object) -> ForkRequest:
    fields: dict[str, object] = {
        "deployment_id": "dep-1",
        "parent_pid": os.getpid(),
        "private_dir": "/tmp/gantry-host-dep-1-x",
        "inbox_limit": 64,
        "environment": {"PATH": "/usr/bin", "HOME": "/tmp/gantry-host-dep-1-x"},
    }
    fields.update(overrides)
    return ForkRequest(**fields)  # type: ignore[arg-type]


def test_request_round_trips() -> None:
    request = _request()
    assert ForkRequest.decode(request.encode()) == request


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("parent_pid", "123"),
        ("parent_pid", True),
        ("parent_pid", 1),
        ("inbox_limit", 0),
        ("deployment_id", ""),
        ("private_dir", "relative/dir"),
        ("environment", {"PATH": 1}),
        ("environment", ["PATH"]),
    ],
)
def test_a_malformed_request_is_refused(field: str, value: object) -> None:
    fields = json.loads(_request().encode())
    fields[field] = value
    with pytest.raises(ForkProtocolError):
        ForkRequest.decode(json.dumps(fields).encode())


def test_an_oversized_request_is_refused_before_it_is_sent() -> None:
    huge = _request(environment={"BIG": "x" * MAX_MESSAGE_BYTES})
    with pytest.raises(ForkProtocolError, match="exceeds"):
        huge.encode()


def test_environment_entries_are_bounded() -> None:
    many = _request(environment={f"V{index}": "1" for index in range(257)})
    with pytest.raises(ForkProtocolError, match="at most 256"):
        ForkRequest.decode(many.encode())


def test_a_reply_needs_a_kind() -> None:
    assert decode_reply(b'{"kind": "forked", "pid": 7}') == {"kind": "forked", "pid": 7}
    for garbage in (b"", b"[]", b"{}", b"\xff"):
        with pytest.raises(ForkProtocolError):
            decode_reply(garbage)


def test_hosts_differing_only_in_what_they_read_after_the_fork_share_a_server() -> None:
    base = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    one = ServerKey.of("/usr/bin/python3", {**base, "HOME": "/a", "GANTRY_TRACE_FILE": "/t1"})
    two = ServerKey.of(
        "/usr/bin/python3", {**base, "HOME": "/b", "GANTRY_MODEL_HOST_TEST_HOOKS": "1"}
    )
    assert one == two
    # A variable an import may read (the OpenMP budget) or another interpreter: another server.
    assert one != ServerKey.of("/usr/bin/python3", {**base, "OMP_NUM_THREADS": "4"})
    assert one != ServerKey.of("/opt/other/python3", base)


@pytest.fixture
def server() -> Iterator[socket.socket]:
    """The worker's end of a real server loop running in a thread."""
    worker_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker_end.settimeout(10)
    exit_codes: list[int] = []
    thread = threading.Thread(
        target=lambda: exit_codes.append(serve(server_end, worker_pid=os.getpid()))
    )
    thread.start()
    try:
        yield worker_end
    finally:
        worker_end.close()
        thread.join(timeout=10)
        server_end.close()
    assert exit_codes == [0]  # the worker closing its end ends the server cleanly


def _ask(server: socket.socket, message: bytes, fds: list[int]) -> dict[str, object]:
    try:
        socket.send_fds(server, [message], fds)
    finally:
        for fd in fds:
            os.close(fd)
    return decode_reply(server.recv(MAX_MESSAGE_BYTES))


def _two_fds() -> list[int]:
    read_end, write_end = os.pipe()
    return [read_end, write_end]


def test_server_refuses_a_request_without_both_descriptors(server: socket.socket) -> None:
    reply = _ask(server, _request().encode(), [os.dup(0)])
    assert reply["kind"] == "refused"
    assert "2 fds, not 1" in str(reply["error"])


def test_server_refuses_garbage_and_keeps_serving(server: socket.socket) -> None:
    assert _ask(server, b"not json", _two_fds())["kind"] == "refused"
    # Still answering: the next malformed request gets its own refusal.
    reply = _ask(server, _request(parent_pid=os.getpid() + 1).encode(), _two_fds())
    assert reply["kind"] == "refused"
    assert "belong to pid" in str(reply["error"])


def test_server_closes_the_descriptors_of_a_refused_request(server: socket.socket) -> None:
    read_end, write_end = os.pipe()
    try:
        socket.send_fds(server, [b"{}"], [write_end])
        os.close(write_end)
        assert decode_reply(server.recv(MAX_MESSAGE_BYTES))["kind"] == "refused"
        # Every copy of the write end is closed, the server's included: the reader sees EOF.
        assert os.read(read_end, 1) == b""
    finally:
        os.close(read_end)

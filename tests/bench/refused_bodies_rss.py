"""The control plane's memory under refused oversize calls (issue 26, item 4).

Starts `gantry up` in a temporary state directory, then sends 16 unauthenticated 60 MB Embeds at
once on each door (the OpenAI HTTP API: headers, then the body as fast as the server takes it; the
gRPC Inference service: one 60 MB message each), then 16 authenticated 30 MB ones (within the
transport's bounds, so read and parsed, then refused by the inference limits), and reports the
control plane's RSS (psutil): its baseline, the peak while the calls run, and where it settles.

    .venv/bin/python -m tests.bench.refused_bodies_rss

`gantry up` passes its environment to the control plane: `MALLOC_ARENA_MAX=2 .venv/bin/python -m
tests.bench.refused_bodies_rss` measures glibc's settings.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import psutil

from gantry.common.grpc_server import CHANNEL_OPTIONS
from gantry.controlplane.app import MEMORY_CHECK_S
from gantry.v1 import inference_pb2, inference_pb2_grpc
from tests.waiting import poll_sync, settled_sync

CALLS = 16
BODY_BYTES = 60 * 1000 * 1000
LEGAL_BYTES = 30 * 1000 * 1000  # under the HTTP body bound and the gRPC receive limit (41 MiB)
READY_TIMEOUT_S = 300.0
# The control plane gives freed memory back when it next looks at its RSS (every MEMORY_CHECK_S):
# its RSS is read once two readings that far apart differ by at most SETTLE_WITHIN_BYTES.
SETTLE_WITHIN_BYTES = 1024 * 1024
SETTLE_TIMEOUT_S = 12 * MEMORY_CHECK_S
MB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def _gantry_up(state: Path) -> Iterator[tuple[psutil.Process, int, int]]:
    grpc_port, http_port, scheduler_port = _free_port(), _free_port(), _free_port()
    argv = [
        sys.executable, "-m", "gantry.cli.main", "up", "--state-dir", str(state),
        "--address", f"127.0.0.1:{grpc_port}", "--http-address", f"127.0.0.1:{http_port}",
        "--scheduler-address", f"127.0.0.1:{scheduler_port}", "--no-metrics",
    ]  # fmt: skip
    up = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        yield _control_plane(up.pid, http_port), grpc_port, http_port
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)


def _control_plane(up_pid: int, http_port: int) -> psutil.Process:
    def started() -> psutil.Process | None:
        for child in psutil.Process(up_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "controlplane" in " ".join(child.cmdline()) and _listening(http_port):
                    return child
        return None

    return poll_sync(started, READY_TIMEOUT_S, "the control plane to start", interval_s=0.5)


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _http_embed(port: int, key: str = "", size: int = BODY_BYTES) -> str:
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nhost: gantry\r\ncontent-type: application/json\r\n"
        f"{auth}content-length: {size}\r\n\r\n"
    ).encode()
    body = b'{"model": "embed", "input": ["' + b"x" * (size - 33) + b'"]}'
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head)
        sent = 0
        try:
            while sent < size:
                sent += sock.send(body[sent : sent + MB])
        except OSError:
            pass  # refused and closed before the body was all sent
        try:
            answer = sock.recv(4096)
        except OSError as error:
            answer = f"({type(error).__name__})".encode()
        status = answer.split(b"\r\n", 1)[0].decode(errors="replace")
        return f"{status} after {sent // MB} MiB"


def _grpc_embed(port: int, key: str = "", size: int = BODY_BYTES) -> str:
    metadata = (("authorization", f"Bearer {key}"),) if key else ()
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = inference_pb2.EmbedRequest(capability="embed", inputs=["x" * size])
        try:
            stub.Embed(request, metadata=metadata, timeout=120)
        except grpc.RpcError as error:
            return f"{error.code().name}: {error.details()}"  # type: ignore[attr-defined]
        return "OK"


def _rss_during(process: psutil.Process, work: Callable[[], list[str]]) -> tuple[int, list[str]]:
    peak, done = process.memory_info().rss, threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, process.memory_info().rss)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        answers = work()
    finally:
        done.set()
        sampler.join()
    return peak, answers


def _settled_rss(process: psutil.Process, when: str) -> int:
    return int(
        settled_sync(
            lambda: process.memory_info().rss,
            SETTLE_TIMEOUT_S,
            f"the control plane's RSS to hold still {when}",
            within=SETTLE_WITHIN_BYTES,
            apart_s=MEMORY_CHECK_S,
        )
    )


def _door(process: psutil.Process, name: str, call: Callable[[], str]) -> None:
    baseline = process.memory_info().rss

    def all_at_once() -> list[str]:
        with concurrent.futures.ThreadPoolExecutor(CALLS) as pool:
            return list(pool.map(lambda _: call(), range(CALLS)))

    peak, answers = _rss_during(process, all_at_once)
    after = _settled_rss(process, "once the calls are over")  # what the process keeps
    print(
        f"{name}: RSS baseline {baseline / MB:.0f} MiB, peak {peak / MB:.0f} MiB, "
        f"after {after / MB:.0f} MiB; answers: {sorted(set(answers))}"
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as state, _gantry_up(Path(state)) as running:
        process, grpc_port, http_port = running
        _settled_rss(process, "past the start's own allocations")
        print(f"control plane pid {process.pid}, MALLOC_* passed to it: {_malloc_env()}")
        _door(process, "HTTP /v1/embeddings, no key, 60 MB", lambda: _http_embed(http_port))
        _door(process, "gRPC Inference/Embed, no key, 60 MB", lambda: _grpc_embed(grpc_port))
        key = (Path(state) / "client.key").read_text().strip()
        _door(
            process,
            "HTTP /v1/embeddings, client key, 30 MB",
            lambda: _http_embed(http_port, key, LEGAL_BYTES),
        )
        _door(
            process,
            "gRPC Inference/Embed, client key, 30 MB",
            lambda: _grpc_embed(grpc_port, key, LEGAL_BYTES),
        )


def _malloc_env() -> dict[str, str]:
    # `gantry up` passes its environment on (its children retitle themselves, so /proc/PID/environ
    # no longer shows it).
    return {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}


if __name__ == "__main__":
    main()

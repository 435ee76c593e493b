"""The model host seam for real: child processes loading a tiny real model, killed and orphaned.

A host whose subject is how it serves (failures, pings, timeouts, a stop, a crash, a failed
load) is forked from this pytest process's warm pool, the path a worker takes by default
(`harness.forked_host`): it costs its model's load, not ~6 s of CPU importing the ML stack
again. The start itself (a fresh interpreter: its titles and versions, its timeout, a missing
interpreter, dying with its parent) runs as `ModelHost.start` without a pool;
tests/integration/test_warm_pool.py holds a forked host to the spawned one.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2, worker_gateway_pb2
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost
from gantry.worker.model_host.serving import (
    TEST_HOOK_FAIL_INPUT,
    TEST_HOOK_HANG_INPUT,
    TEST_HOOK_SLOW_INPUT,
)
from tests.integration.harness import forked_host
from tests.integration.polling import wait_until
from tests.integration.process_titles import pids_titled

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = {"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"}


def _spec(
    model_directory: Path, deployment_id: str, *, test_hooks: bool = False, **env: str
) -> HostLaunchSpec:
    return HostLaunchSpec(
        deployment_id=deployment_id,
        model_directory=model_directory,
        adapter=common_pb2.AdapterSettings(adapter="sentence_transformers", device="cpu"),
        python_executable=sys.executable,
        env=env,
        load_timeout_s=90,
        test_hooks=test_hooks,
    )


def _vectors(result: worker_gateway_pb2.EmbedResult) -> np.ndarray:
    return np.frombuffer(result.float32_le, dtype="<f4").reshape(result.count, result.dim)


def _assert_same_embeddings(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape
    cosine = (actual * expected).sum(axis=1) / (
        np.linalg.norm(actual, axis=1) * np.linalg.norm(expected, axis=1)
    )
    assert (cosine >= 0.9999).all(), cosine


def _pid_exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _process_gone(pid: int) -> bool:
    """Gone or a zombie: an orphan's reaper may be a PID 1 that never reaps."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


@pytest.fixture(scope="module")
def reference_model(tiny_model_dir: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(tiny_model_dir), device="cpu", local_files_only=True)


async def test_host_embeds_like_the_model_in_process_alone_and_concurrently_then_is_gone(
    tiny_model_dir: Path,
    reference_model,
    tmp_path: Path,
) -> None:
    trace_file = tmp_path / "spans.jsonl"
    host = await ModelHost.start(
        _spec(tiny_model_dir, "dep-embed", GANTRY_TRACE_FILE=str(trace_file))
    )
    try:
        assert host.alive
        assert host.ready.pid == host.pid
        assert host.ready.dim == 32
        assert host.ready.rss_bytes > 0
        assert host.ready.load_seconds > 0
        assert {"python", "torch", "transformers", "sentence_transformers", "device"} <= set(
            host.ready.runtime_versions
        )
        assert host.ready.runtime_versions["device"] == "cpu"
        # Whatever this kernel allows, the host says what it reached and why.
        assert host.ready.isolation.removesuffix("+SECCOMP_NET") in {
            "NONE",
            "LANDLOCK_FS",
            "LANDLOCK_FS_NET",
        }
        assert host.ready.isolation_reason
        assert pids_titled("gantry model-host dep-embed") == [host.pid]

        sentences = ["hello world", "the quick brown fox jumps over the lazy dog"]
        result = await host.embed(sentences, trace_context=TRACEPARENT, timeout_s=30)
        assert (result.count, result.dim) == (2, 32)
        _assert_same_embeddings(_vectors(result), reference_model.encode(sentences))

        # Concurrent callers share forward passes (micro-batching) but each gets its own rows.
        requests = [
            [f"sentence number {index}", "red green blue"][: 1 + index % 2] for index in range(8)
        ]
        results = await asyncio.gather(
            *(host.embed(inputs, trace_context={}, timeout_s=30) for inputs in requests)
        )
        for inputs, concurrent_result in zip(requests, results, strict=True):
            assert concurrent_result.count == len(inputs)
            _assert_same_embeddings(_vectors(concurrent_result), reference_model.encode(inputs))
    finally:
        evidence = await host.stop()

    assert evidence == worker_gateway_pb2.UnloadEvidence(
        pid=host.pid, process_exited=True, has_exit_code=True, exit_code=0
    )
    assert not _pid_exists(host.pid)  # reaped by the parent, not just a zombie
    assert pids_titled("gantry model-host dep-embed") == []
    assert not host.alive
    spans = [json.loads(line) for line in trace_file.read_text().splitlines()]
    embed_spans = [
        span
        for span in spans
        if span["name"] == "model_host.embed" and span["context"]["trace_id"] == f"0x{TRACE_ID}"
    ]
    assert len(embed_spans) == 1
    assert embed_spans[0]["parent_id"] == f"0x{PARENT_SPAN_ID}"


async def test_failed_forward_pass_fails_only_its_request_and_the_host_keeps_serving(
    tiny_model_dir: Path,
    reference_model,
) -> None:
    host = await forked_host(_spec(tiny_model_dir, "dep-invoke-fail", test_hooks=True))
    try:
        failing, healthy = await asyncio.gather(
            host.embed([TEST_HOOK_FAIL_INPUT], trace_context={}, timeout_s=30),
            host.embed(["hello world"], trace_context={}, timeout_s=30),
            return_exceptions=True,
        )
        assert isinstance(failing, GantryError)
        assert failing.reason == "INVOKE_FAILED"
        assert "test hook" in failing.message
        assert isinstance(healthy, worker_gateway_pb2.EmbedResult)
        _assert_same_embeddings(_vectors(healthy), reference_model.encode(["hello world"]))
        assert host.alive

        # Past its deadline a request fails on its own; the hung child is the caller's to stop.
        with pytest.raises(GantryError) as caught:
            await host.embed([TEST_HOOK_HANG_INPUT], trace_context={}, timeout_s=0.5)
        assert caught.value.reason == "DEADLINE_EXCEEDED"
    finally:
        # The child is stuck in the hung forward pass: stop must escalate past Shutdown.
        evidence = await host.stop(grace_s=0.5)
    assert evidence.process_exited
    assert (evidence.has_exit_code, evidence.exit_signal) == (False, signal.SIGTERM)


async def test_ping_is_answered_during_a_forward_pass_and_rss_is_current(
    tiny_model_dir: Path,
) -> None:
    host = await forked_host(_spec(tiny_model_dir, "dep-ping", test_hooks=True))
    try:
        hung = asyncio.create_task(
            host.embed([TEST_HOOK_HANG_INPUT], trace_context={}, timeout_s=60)
        )
        await wait_until(
            lambda: any("test hook: hanging" in line for line in host.stderr_tail()),
            timeout_s=30,
            what="the child to enter the hung forward pass",
        )
        # The reader thread answers: a busy model is not a hung process.
        pong = await host.ping(timeout_s=2)
        assert pong.rss_bytes > 0
        statm_pages = int(Path(f"/proc/{host.pid}/statm").read_text().split()[1])
        assert host.rss_bytes() == statm_pages * os.sysconf("SC_PAGE_SIZE")
        hung.cancel()
    finally:
        evidence = await host.stop(grace_s=0.5)
    assert evidence.process_exited
    assert host.rss_bytes() == 0


async def test_timeout_is_honoured_in_the_child_and_cancel_drops_queued_work(
    tiny_model_dir: Path,
) -> None:
    host = await forked_host(_spec(tiny_model_dir, "dep-queue", test_hooks=True))
    try:
        # A slow forward pass holds the main thread; everything sent meanwhile waits in its inbox.
        slow = asyncio.create_task(
            host.embed([TEST_HOOK_SLOW_INPUT], trace_context={}, timeout_s=30)
        )
        await wait_until(
            lambda: any("test hook: slow" in line for line in host.stderr_tail()),
            timeout_s=30,
            what="the slow forward pass to start",
        )
        with pytest.raises(GantryError) as timed_out:
            await host.embed(["expires while queued"], trace_context={}, timeout_s=0.3)
        assert timed_out.value.reason == "DEADLINE_EXCEEDED"
        # The caller is not held past its timeout: released while the slow pass (1.5 s) still
        # holds the child, so by its own deadline, not by the child reaching its request.
        assert not slow.done()
        cancelled = asyncio.create_task(
            host.embed(["cancelled while queued"], trace_context={}, timeout_s=30)
        )
        await wait_until(lambda: host.pending_count == 2, 5, "the second request to be sent")
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await slow
        await wait_until(
            lambda: sum("before running it" in line for line in host.stderr_tail()) == 2,
            timeout_s=10,
            what="the child to drop both queued requests unrun",
        )
        tail = "\n".join(host.stderr_tail())
        # The timed-out caller also sent a CancelRequest, so either rule may drop request 2 first.
        assert "request 2 before running it" in tail
        assert "dropped cancelled request 3 before running it" in tail
        assert host.pending_count == 0
        result = await host.embed(["still serving"], trace_context={}, timeout_s=30)
        assert result.count == 1
    finally:
        await host.stop()


async def test_stop_that_cannot_confirm_the_exit_claims_no_exit_code(
    tiny_model_dir: Path,
) -> None:
    host = await forked_host(_spec(tiny_model_dir, "dep-sigstop"))
    os.kill(host.pid, signal.SIGSTOP)
    try:
        embed = asyncio.create_task(host.embed(["x"], trace_context={}, timeout_s=30))
        await wait_until(lambda: host.pending_count == 1, 5, "the request to be pending")
        host.kill_unresponsive("test: stopped")
        with pytest.raises(GantryError) as caught:
            await embed
        assert caught.value.reason == "RUNTIME_UNRESPONSIVE"
        with pytest.raises(GantryError) as after:
            await host.embed(["y"], trace_context={}, timeout_s=30)
        assert after.value.reason == "RUNTIME_UNRESPONSIVE"
    finally:
        evidence = await host.stop(grace_s=0.5)
    assert evidence.process_exited
    assert (evidence.has_exit_code, evidence.exit_signal) == (False, signal.SIGKILL)


async def test_child_killed_mid_request_raises_runtime_crashed_and_reports_the_exit(
    tiny_model_dir: Path,
) -> None:
    exits: list[int] = []
    exited = asyncio.Event()

    def on_exit(_host: ModelHost, returncode: int) -> None:
        exits.append(returncode)
        exited.set()

    host = await forked_host(_spec(tiny_model_dir, "dep-crash", test_hooks=True), on_exit=on_exit)
    pending = asyncio.create_task(
        host.embed([TEST_HOOK_HANG_INPUT], trace_context={}, timeout_s=60)
    )
    await wait_until(
        lambda: any("test hook: hanging" in line for line in host.stderr_tail()),
        timeout_s=30,
        what="the child to enter the hung forward pass",
    )
    os.kill(host.pid, signal.SIGKILL)
    with pytest.raises(GantryError) as caught:
        await pending
    # Failed by the child's exit, not by its 60 s timeout (that would say DEADLINE_EXCEEDED).
    assert caught.value.reason == "RUNTIME_CRASHED"
    assert "SIGKILL" in caught.value.message
    await asyncio.wait_for(exited.wait(), timeout=5)
    assert exits == [-signal.SIGKILL]
    assert not host.alive
    with pytest.raises(GantryError) as after:
        await host.embed(["hello"], trace_context={}, timeout_s=5)
    assert after.value.reason == "RUNTIME_CRASHED"
    evidence = await host.stop()
    assert evidence.process_exited
    assert (evidence.has_exit_code, evidence.exit_signal) == (False, signal.SIGKILL)


async def test_unloadable_model_directory_fails_the_start_with_the_cause(tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{ this is not json")
    (broken / "modules.json").write_text("[{ neither is this")
    with pytest.raises(GantryError) as caught:
        await forked_host(_spec(broken, "dep-broken"))
    assert caught.value.reason == "LOAD_FAILED"
    assert "loading the model failed" in caught.value.message
    assert caught.value.metadata["deployment_id"] == "dep-broken"
    assert pids_titled("gantry model-host dep-broken") == []


async def test_missing_model_directory_fails_the_start(tmp_path: Path) -> None:
    with pytest.raises(GantryError) as caught:
        await ModelHost.start(_spec(tmp_path / "absent", "dep-absent"))
    assert caught.value.reason == "LOAD_FAILED"
    assert "does not exist" in caught.value.message


async def test_start_that_times_out_kills_the_child(tiny_model_dir: Path) -> None:
    spec = _spec(tiny_model_dir, "dep-slow-load")
    spec = HostLaunchSpec(**{**spec.__dict__, "load_timeout_s": 0.2})
    with pytest.raises(GantryError) as caught:
        await ModelHost.start(spec)
    assert caught.value.reason == "LOAD_FAILED"
    assert "not ready within" in caught.value.message
    assert pids_titled("gantry model-host dep-slow-load") == []


async def test_missing_python_executable_is_an_unavailable_environment(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "dep-no-python")
    spec = HostLaunchSpec(**{**spec.__dict__, "python_executable": str(tmp_path / "python")})
    with pytest.raises(GantryError) as caught:
        await ModelHost.start(spec)
    assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"


_PARENT_SCRIPT = """
import asyncio, sys
from pathlib import Path
from gantry.v1 import common_pb2
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost

async def main() -> None:
    host = await ModelHost.start(HostLaunchSpec(
        deployment_id="dep-orphan", model_directory=Path(sys.argv[1]),
        adapter=common_pb2.AdapterSettings(device="cpu"), python_executable=sys.executable))
    print(host.pid, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_child_dies_with_its_parent(tiny_model_dir: Path) -> None:
    parent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _PARENT_SCRIPT,
        str(tiny_model_dir),
        stdout=subprocess.PIPE,
    )
    try:
        assert parent.stdout is not None
        line = await asyncio.wait_for(parent.stdout.readline(), timeout=90)
        child_pid = int(line)
        assert not _process_gone(child_pid)
    finally:
        parent.kill()
        await parent.wait()
    await wait_until(lambda: _process_gone(child_pid), timeout_s=10, what="the orphan to die")


async def test_network_guard_refuses_internet_sockets_but_not_unix_ones() -> None:
    script = """
import socket
from gantry.worker.model_host.hardening import NetworkDisabledError, install_network_guard
install_network_guard()
for attempt in (lambda: socket.create_connection(("127.0.0.1", 9), timeout=1),
                lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(("10.0.0.1", 80)),
                lambda: socket.socket(socket.AF_INET6).connect_ex(("::1", 80))):
    try:
        attempt()
    except NetworkDisabledError:
        continue
    raise SystemExit("a connection was not refused")
left, right = socket.socketpair(socket.AF_UNIX)
left.sendall(b"ok")
assert right.recv(2) == b"ok"
"""
    checker = await asyncio.create_subprocess_exec(sys.executable, "-c", script)
    assert await asyncio.wait_for(checker.wait(), timeout=30) == 0

"""Managed servers for real: llama-cpp-python's OpenAI-compatible server (`.venv-llama`), started
by the worker's runtime as a child process, serves the tiny causal LM converted to GGUF; the same
greedy text as transformers, streamed and not. A port in use and a server that binds beyond
loopback are refused (the latter killed and verified gone); a stop verifies the process gone; a
server killed with SIGKILL is restarted by supervision with backoff; an environment without the
server is RUNTIME_ENVIRONMENT_UNAVAILABLE. vLLM does not install here: its argv is checked
statically (tests/unit/test_managed_server_parts.py)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

from gantry.common.artifact_walk import build_manifest
from gantry.common.errors import GantryError
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.crash_policy import RestartPolicy
from gantry.worker.environment_facts import RuntimeEnvironments
from gantry.worker.managed_server.kinds import LLAMA_CPP_SERVER, SERVER_KINDS
from gantry.worker.managed_server.server_process import ManagedServer, ServerLaunch
from gantry.worker.model_host.environments import ENV_MAP_JSON
from gantry.worker.model_host.proc_facts import process_identity
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost
from gantry.worker.nvml_readings import Nvml
from gantry.worker.residents import RESIDENT, ResidentFacts
from gantry.worker.runtime_adapters.base import Prepared, PrepareRequest, StartRequest
from gantry.worker.runtime_adapters.llama_cpp_server import LlamaCppServer
from gantry.worker.supervision import ServingLoad, SupervisionSettings, Supervisor
from tests.fixtures.llama_env import llama_python  # noqa: F401  (fixture)
from tests.fixtures.tiny_causal_lm_gguf import build_tiny_causal_lm_gguf
from tests.integration.polling import wait_until

PROMPT = "the cat"
NEW_TOKENS = 24
GENERATE_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the transformers directory, the directory holding its GGUF conversion)."""
    root = tmp_path_factory.mktemp("managed-server-models")
    gguf_dir = build_tiny_causal_lm_gguf(root)
    return root / "hf", gguf_dir


@pytest.fixture(scope="module")
def transformers_greedy(tiny_models: tuple[Path, Path]) -> str:
    """What transformers generates greedily for PROMPT with the same weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_dir, _ = tiny_models
    tokenizer = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True).eval()
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        output = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    return str(tokenizer.decode(output[0, ids.shape[1] :], skip_special_tokens=True))


def _spec(python: str, directory: Path, name: str = "llama-dep") -> HostLaunchSpec:
    return HostLaunchSpec(
        deployment_id=name,
        model_directory=directory,
        adapter=common_pb2.AdapterSettings(adapter=LLAMA_CPP_SERVER, device="cpu"),
        python_executable=python,
        load_timeout_s=120.0,
    )


def _llama_load(directory: Path, *, name: str) -> ServingLoad:
    """A LOAD of the GGUF in `directory` (its manifest taken now) by the llama server adapter."""
    manifest = [
        common_pb2.ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256)
        for e in build_manifest(directory)
    ]
    return ServingLoad(
        prepare=PrepareRequest(
            environment_id="llama",
            settings=common_pb2.AdapterSettings(adapter=LLAMA_CPP_SERVER, device="cpu"),
            artifact_root=directory.parent,
            artifact_location=directory.name,
            manifest=manifest,
        ),
        start=StartRequest(name=name, load_timeout_s=120, max_pending=8, inbox_limit=8),
    )


def _gone(pid: int, started: psutil.Process | None) -> bool:
    now = process_identity(pid)
    return now is None or now != started


async def test_the_managed_llama_cpp_server_serves_the_same_greedy_text_as_transformers(
    llama_python: str,  # noqa: F811
    tiny_models: tuple[Path, Path],
    transformers_greedy: str,
) -> None:
    started = time.monotonic()
    server = await ManagedServer.start(_spec(llama_python, tiny_models[1]))
    start_seconds = time.monotonic() - started
    ticks = process_identity(server.pid)
    try:
        assert server.ready.isolation == "NONE" and "127.0.0.1" in server.ready.isolation_reason
        payload = wg.GeneratePayload(prompt=PROMPT, max_tokens=NEW_TOKENS)
        whole = await server.generate(payload, trace_context={}, timeout_s=GENERATE_TIMEOUT_S)
        # The same tokens: transformers decodes a lone half of a UTF-8 character as U+FFFD,
        # llama-cpp-python drops it.
        assert whole.text == transformers_greedy.replace("\ufffd", "")
        assert whole.finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert (whole.prompt_tokens, whole.completion_tokens) == (6, NEW_TOKENS)

        deltas: list[wg.GenerateDelta] = []
        payload.stream = True
        streamed = await server.generate(
            payload, trace_context={}, timeout_s=GENERATE_TIMEOUT_S, on_delta=deltas.append
        )
        assert streamed.text == whole.text == "".join(d.text for d in deltas)
        assert streamed.finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert [d.completion_tokens for d in deltas] == list(range(1, len(deltas) + 1))

        chat = await server.generate(
            wg.GeneratePayload(
                messages=[common_pb2.ChatMessage(role="user", content="hi")], max_tokens=4
            ),
            trace_context={},
            timeout_s=GENERATE_TIMEOUT_S,
        )
        assert chat.completion_tokens == 4 and chat.prompt_tokens > 0

        health = await server.check_model(timeout_s=GENERATE_TIMEOUT_S)
        assert health.model.status == wg.HEALTH_STATUS_OK, health
        with pytest.raises(GantryError) as refused:
            await server.embed(["x"], trace_context={}, timeout_s=5)
        assert refused.value.reason == "INVALID_PAYLOAD" and LLAMA_CPP_SERVER in str(refused.value)
        print(
            f"\nllama_cpp_server: start {start_seconds:.2f}s, rss {server.rss_bytes()} bytes, "
            f"ready.load_seconds {server.ready.load_seconds:.2f}"
        )
    finally:
        evidence = await server.stop(grace_s=5)
    assert evidence.process_exited and _gone(server.pid, ticks)
    # SIGTERM was enough: uvicorn exits by itself on it.
    assert evidence.has_exit_code or evidence.exit_signal == signal.SIGTERM, evidence


async def test_a_cancelled_stream_closes_the_connection_and_the_server_serves_the_next_call(
    llama_python: str,  # noqa: F811
    tiny_models: tuple[Path, Path],
) -> None:
    server = await ManagedServer.start(_spec(llama_python, tiny_models[1]))
    try:
        first_delta = asyncio.Event()
        task = asyncio.create_task(
            server.generate(
                wg.GeneratePayload(prompt=PROMPT, max_tokens=200, stream=True),
                trace_context={},
                timeout_s=GENERATE_TIMEOUT_S,
                on_delta=lambda _: first_delta.set(),
            )
        )
        await first_delta.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await server.generate(
            wg.GeneratePayload(prompt=PROMPT, max_tokens=2),
            trace_context={},
            timeout_s=GENERATE_TIMEOUT_S,
        )
        assert after.completion_tokens == 2
    finally:
        assert (await server.stop(grace_s=5)).process_exited


async def test_a_server_busy_with_a_call_is_judged_by_that_call_not_asked_a_ping(
    llama_python: str,  # noqa: F811
    tiny_models: tuple[Path, Path],
) -> None:
    # llama.cpp's server serves one request at a time, /v1/models included: a ping asked during
    # a generation waits behind it, and one longer than the ping's deadline had the server
    # killed as hung. A stopped server stands in for a busy one: whatever it does, a ping while
    # a call is in flight is answered by that call; the call's own deadline finds a server that
    # really hangs, and the next ping is asked of it and fails.
    server = await ManagedServer.start(_spec(llama_python, tiny_models[1]))
    os.kill(server.pid, signal.SIGSTOP)
    try:
        call = asyncio.create_task(
            server.generate(
                wg.GeneratePayload(prompt=PROMPT, max_tokens=4, stream=True),
                trace_context={},
                timeout_s=2.0,
            )
        )
        await wait_until(lambda: server.answered_by_its_calls, 10, "the call in flight")
        await server.ping(timeout_s=0.5)
        with pytest.raises(GantryError) as expired:
            await call
        assert expired.value.reason == "DEADLINE_EXCEEDED", expired.value
        assert not server.answered_by_its_calls
        with pytest.raises(GantryError) as hung:
            await server.ping(timeout_s=0.5)
        assert hung.value.reason == "DEADLINE_EXCEEDED", hung.value
    finally:
        os.kill(server.pid, signal.SIGCONT)
        assert (await server.stop(grace_s=5)).process_exited


async def test_a_port_in_use_is_refused_before_anything_starts(
    llama_python: str,  # noqa: F811
    tiny_models: tuple[Path, Path],
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(GantryError) as refused:
            await ManagedServer.start(
                _spec(llama_python, tiny_models[1]), port_allocator=lambda: port
            )
    assert refused.value.reason == "LOAD_FAILED"
    assert refused.value.metadata["refusal"] == "PORT_IN_USE"
    assert refused.value.metadata["port"] == str(port)


# A tiny OpenAI-ish server that binds every address: what a managed server must never do.
_BINDS_EVERYWHERE = """
import http.server, json, sys
class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": []}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("0.0.0.0", int(sys.argv[1])), Models).serve_forever()
"""


async def test_a_server_that_binds_beyond_loopback_is_refused_and_left_dead(
    tmp_path: Path,
) -> None:
    script = tmp_path / "binds_everywhere.py"
    script.write_text(_BINDS_EVERYWHERE)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    launch = ServerLaunch(
        deployment_id="everywhere",
        kind=SERVER_KINDS[LLAMA_CPP_SERVER],
        argv=(sys.executable, "-I", str(script), str(port)),
        executable=sys.executable,
        port=port,
        served_name="everywhere",
        load_timeout_s=30.0,
    )
    with pytest.raises(GantryError) as refused:
        await ManagedServer.launch(launch)
    error = refused.value
    assert error.reason == "RUNTIME_INCOMPATIBLE"
    assert error.metadata["refusal"] == "BOUND_BEYOND_LOOPBACK"
    assert f"0.0.0.0:{port}" in error.message
    pid = int(error.metadata["pid"])
    assert process_identity(pid) is None  # killed and reaped before the refusal
    with socket.socket() as again:  # and its port is free again (TIME_WAIT aside)
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


async def test_a_server_that_exits_before_answering_fails_its_load_with_its_output(
    tmp_path: Path,
) -> None:
    launch = ServerLaunch(
        deployment_id="exits",
        kind=SERVER_KINDS[LLAMA_CPP_SERVER],
        argv=(sys.executable, "-I", "-c", "import sys; print('cannot bind: boom'); sys.exit(3)"),
        executable=sys.executable,
        port=_free_port(),
        served_name="exits",
    )
    with pytest.raises(GantryError) as failed:
        await ManagedServer.launch(launch)
    assert failed.value.reason == "LOAD_FAILED"
    assert "exit code 3" in failed.value.message and "cannot bind: boom" in failed.value.message
    # Named and judged as a model host's failed start is (`reclaim_verdict`): reaped, so a CPU
    # residency is released and a GPU one waits for NVML.
    assert failed.value.metadata["reaped"] == "true"
    assert process_identity(int(failed.value.metadata["pid"])) is None


# A stdlib OpenAI-ish server on loopback that re-executes itself (same pid) without
# HF_HUB_OFFLINE first: the flag its evidence must then report unset.
_DROPS_AN_OFFLINE_FLAG = """
import http.server, json, os, sys
if "HF_HUB_OFFLINE" in os.environ:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    os.execve(sys.executable, [sys.executable, *sys.argv], env)
class Served(http.server.BaseHTTPRequestHandler):
    def _answer(self, answer):
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self._answer({"object": "list", "data": [{"id": "flags", "object": "model"}]})
    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        self._answer({"choices": [{"index": 0, "text": " x", "finish_reason": "length"}],
                      "usage": {"prompt_tokens": 2, "completion_tokens": 1}})
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Served).serve_forever()
"""


async def test_a_servers_offline_evidence_is_what_its_process_was_started_with(
    tmp_path: Path,
) -> None:
    script = tmp_path / "drops_a_flag.py"
    script.write_text(_DROPS_AN_OFFLINE_FLAG)
    port = _free_port()
    launch = ServerLaunch(
        deployment_id="flags",
        kind=SERVER_KINDS[LLAMA_CPP_SERVER],
        argv=(sys.executable, "-I", str(script), str(port)),
        executable=sys.executable,
        port=port,
        served_name="flags",
        load_timeout_s=30.0,
    )
    server = await ManagedServer.launch(launch)
    try:
        evidence = (await server.probe_check(timeout_s=10.0)).offline
    finally:
        await server.stop(grace_s=5.0)
    assert evidence.offline_env["HF_HUB_OFFLINE"] == "unset"  # not the worker's constant
    assert evidence.offline_env["TRANSFORMERS_OFFLINE"] == "1"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_an_environment_without_the_server_executable_is_unavailable(
    tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    missing = tmp_path / "no-env" / "bin" / "python"
    with pytest.raises(GantryError) as refused:
        await ManagedServer.start(_spec(str(missing), tiny_models[1]))
    assert refused.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert str(missing) in refused.value.message
    # The worker's default environment has no llama_cpp: it does not list the adapter.
    environments = RuntimeEnvironments({})
    try:
        with pytest.raises(GantryError) as unavailable:
            await environments.require("", adapter=LLAMA_CPP_SERVER)
    finally:
        await environments.close()
    assert unavailable.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert LLAMA_CPP_SERVER in unavailable.value.message


async def test_the_llama_environment_lists_the_server_from_its_facts(
    llama_python: str,  # noqa: F811
) -> None:
    environments = RuntimeEnvironments({ENV_MAP_JSON: json.dumps({"llama": llama_python})})
    try:
        runtime = await environments.require("llama", adapter=LLAMA_CPP_SERVER)
    finally:
        await environments.close()
    assert list(runtime.environment.adapters) == [LLAMA_CPP_SERVER]
    assert runtime.environment.versions["llama-cpp-python"] == "0.3.36"
    assert "vllm_server" not in runtime.environment.adapters


async def test_a_killed_server_is_restarted_with_backoff_by_supervision(
    llama_python: str,  # noqa: F811
    tiny_models: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    directory = tmp_path / "model"
    shutil.copytree(tiny_models[1], directory)
    changed = asyncio.Event()
    environments = RuntimeEnvironments({ENV_MAP_JSON: json.dumps({"llama": llama_python})})
    # The real registry and the adapter's real prepare (verified copy) and start.
    supervisor = Supervisor(
        SupervisionSettings(
            restart=RestartPolicy(initial_backoff_s=0.2, max_backoff_s=1.0),
            stop_grace_s=5.0,
        ),
        on_change=changed.set,
        host_factory=ModelHost.start,  # a model host's factory: never a server's
        environments=environments,
    )
    load = _llama_load(directory, name="restarts")
    facts = ResidentFacts(
        artifact_digest="sha256:x",
        environment_id="llama",
        adapter_digest="a",
        environment_fingerprint="f",
    )
    resident = await supervisor.load("restarts", facts, load, trace_context={})
    first = resident.host
    assert isinstance(first, ManagedServer)
    try:
        os.kill(first.pid, signal.SIGKILL)
        while not (
            resident.state == RESIDENT and resident.host is not None and resident.host is not first
        ):
            changed.clear()
            await asyncio.wait_for(changed.wait(), 60)
        assert resident.restart_count == 1
        assert resident.last_failure is not None
        assert resident.last_failure.reason == "RUNTIME_CRASHED"
        second = supervisor.host_for_invoke("restarts")
        assert second.pid != first.pid
        result = await second.generate(
            wg.GeneratePayload(prompt=PROMPT, max_tokens=3),
            trace_context={},
            timeout_s=GENERATE_TIMEOUT_S,
        )
        assert result.completion_tokens == 3
    finally:
        evidence = await supervisor.unload("restarts")
        await environments.close()
    assert evidence.process_exited


async def test_the_probe_lifecycle_measures_the_server_and_verifies_it_gone(
    llama_python: str,  # noqa: F811
    tiny_models: tuple[Path, Path],
) -> None:
    adapter = LlamaCppServer()
    prepared = Prepared(
        adapter=adapter.name,
        settings=common_pb2.AdapterSettings(adapter=LLAMA_CPP_SERVER),
        directory=tiny_models[1],
        files_verified=1,
        bytes_verified=1,
        python_executable=llama_python,
        environment=wg.RuntimeEnvironment(environment_id="llama"),
    )
    running = await adapter.start(
        prepared,
        StartRequest(name="probe-llama", load_timeout_s=120, max_pending=8, inbox_limit=8),
    )
    try:
        result = await adapter.probe(running, timeout_s=GENERATE_TIMEOUT_S)
        health = (await adapter.health(running, deep=True, timeout_s=GENERATE_TIMEOUT_S)).report
    except BaseException:
        await adapter.stop(running, grace_s=0)
        raise
    unloaded = await adapter.unload(running, grace_s=5, nvml=Nvml.open())
    assert result.health.model.status == wg.HEALTH_STATUS_OK and result.output_finite
    assert list(result.output_shape) == [1, 1]
    assert result.memory.rss_current.bytes > 0 and "VmRSS" in result.memory.rss_current.source
    assert result.memory.rss_peak.bytes >= result.memory.rss_current.bytes
    assert result.memory.cuda_allocated_after_load.unavailable
    assert health.model.status == wg.HEALTH_STATUS_OK, health
    assert unloaded.stopped.process_exited and unloaded.reclaim.reaped
    assert "managed server" in unloaded.cuda_allocated_after_unload.unavailable
    print(
        f"\nprobe: rss {result.memory.rss_current.bytes} first {result.first_invoke_seconds:.3f}s"
    )

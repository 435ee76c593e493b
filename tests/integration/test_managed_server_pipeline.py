"""A managed llama.cpp server through the whole of Gantry, on SQLite and PostgreSQL: the tiny causal
LM's GGUF registered, assessed in the "llama" environment, profiled for `llama_cpp_server`,
probed, approved and deployed, then served by Generate and GenerateStream (control plane ->
scheduler -> real worker -> the server the worker started on loopback).

The same model also runs in process (`transformers_causal_lm`, the worker's default
environment), so the two runtimes answer one greedy prompt side by side: the same text, but for
the lone half of a UTF-8 character transformers shows as U+FFFD and llama-cpp-python drops.
Unloading stops the server and verifies it gone; nothing else was ever started for it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.worker.model_host.environments import DEFAULT_EXECUTABLE, ENV_MAP_FILE, ENV_MAP_JSON
from gantry.worker.model_host.proc_facts import process_identity
from tests.fixtures.llama_env import llama_python  # noqa: F401  (fixture)
from tests.fixtures.tiny_causal_lm_gguf import build_tiny_causal_lm_gguf
from tests.integration.harness import running_gantry, wait_for, walk_the_gates

READY = cp.DEPLOYMENT_STATE_READY
PROMPT = "the cat"  # its 24 greedy tokens agree between the two runtimes (test_managed_server)
NEW_TOKENS = 24


def _worker_env(python: str) -> dict[str, str]:
    """This process's environment with "llama" mapped to the llama python (and nothing else)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in (ENV_MAP_JSON, ENV_MAP_FILE, DEFAULT_EXECUTABLE)
    }
    env[ENV_MAP_JSON] = json.dumps({"llama": python})
    return env


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


async def test_a_gguf_walks_every_gate_and_is_served_by_the_managed_server_like_in_process(
    database_url: str,
    tmp_path: Path,
    llama_python: str,  # noqa: F811
) -> None:
    models = build_tiny_causal_lm_gguf(tmp_path / "models")  # models/hf and its GGUF beside
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root) as harness:
        await harness.start_worker(
            await harness.register_node("llama-node"), env=_worker_env(llama_python)
        )
        gguf = await harness.register_model(models, "tiny-lm-gguf")
        hf = await harness.register_model(tmp_path / "models" / "hf", "tiny-lm-hf")
        served = await walk_the_gates(
            harness.operator,
            harness.op_md,
            artifact_set_id=gguf.artifact_set_id,
            capability="lm-server",
            adapter=common_pb2.AdapterSettings(
                adapter="llama_cpp_server", device="cpu", max_new_tokens=64
            ),
            environment_id="llama",
        )
        in_process = await walk_the_gates(
            harness.operator,
            harness.op_md,
            artifact_set_id=hf.artifact_set_id,
            capability="lm-host",
            adapter=common_pb2.AdapterSettings(adapter="transformers_causal_lm", device="cpu"),
        )
        server = await harness.wait_deployment(served.deployment_id, READY, timeout=180)
        await harness.wait_deployment(in_process.deployment_id, READY, timeout=180)
        pid = server.residencies[0].pid
        started = process_identity(pid)
        assert "llama_cpp.server" in _command_line(pid), _command_line(pid)
        assert "--host 127.0.0.1" in _command_line(pid)

        def ask(capability: str) -> inf.GenerateRequest:
            return inf.GenerateRequest(capability=capability, prompt=PROMPT, max_tokens=NEW_TOKENS)

        client = harness.client_md
        from_server = await harness.inference.Generate(ask("lm-server"), metadata=client)
        from_host = await harness.inference.Generate(ask("lm-host"), metadata=client)
        assert from_server.text == from_host.text.replace("\ufffd", "")
        assert from_server.deployment_id == served.deployment_id
        assert from_server.finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert from_server.completion_tokens == NEW_TOKENS

        chunks = [
            chunk
            async for chunk in harness.inference.GenerateStream(
                ask("lm-server"), metadata=client, timeout=60
            )
        ]
        assert "".join(chunk.text for chunk in chunks) == from_server.text
        assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH

        # Unloading stops the server the worker started, and it is verified gone.
        await harness.operator.UnloadDeployment(
            cp.UnloadDeploymentRequest(deployment_id=served.deployment_id), metadata=harness.op_md
        )
        await harness.wait_deployment(served.deployment_id, cp.DEPLOYMENT_STATE_UNLOADED)

        def gone() -> bool:
            now = process_identity(pid)
            return now is None or now != started

        await wait_for(gone, timeout=30, what=f"the managed server {pid} to be gone")
        # The in-process deployment was never touched.
        assert (await harness.deployment(in_process.deployment_id)).state == READY

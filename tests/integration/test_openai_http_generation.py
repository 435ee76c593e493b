"""/v1/completions and /v1/chat/completions on the tiny causal LM, walked through every gate to
READY, driven by the real `openai` SDK: with greedy decoding the text is gRPC Generate's, whether
asked for whole or streamed as server-sent events (joined in order; the finish reason and token
counts are the model host's), and the handlers' own validation refuses what it refuses over gRPC,
naming the OpenAI parameter.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

from gantry.v1 import common_pb2
from gantry.v1 import inference_pb2 as inf
from tests.integration.generation_support import tiny_lm_ready
from tests.integration.harness import Harness, running_gantry

CAPABILITY = "tiny-lm"
MAX_NEW_TOKENS = 48  # the deployment's bound
PROMPT = "The weather"
FINISH = {common_pb2.FINISH_REASON_STOP: "stop", common_pb2.FINISH_REASON_LENGTH: "length"}


@pytest.fixture
async def gantry(
    database_url: str, tmp_path: Path, tiny_causal_lm_dir: Path
) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root, http_listen="127.0.0.1:0") as harness:
        await tiny_lm_ready(
            harness, tiny_causal_lm_dir, capability=CAPABILITY, max_new_tokens=MAX_NEW_TOKENS
        )
        yield harness


def sdk(harness: Harness) -> openai.AsyncOpenAI:
    assert harness.control_plane.http_api is not None
    return openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{harness.control_plane.http_api.port}/v1",
        api_key=harness.api_key,
        max_retries=0,
    )


async def test_completions_whole_and_streamed_are_grpc_generates_greedy_text(
    gantry: Harness,
) -> None:
    expected = await gantry.inference.Generate(
        inf.GenerateRequest(capability=CAPABILITY, prompt=PROMPT, max_tokens=24),
        metadata=gantry.client_md,
        timeout=60,
    )
    async with sdk(gantry) as client:
        whole = await client.completions.create(model=CAPABILITY, prompt=PROMPT, max_tokens=24)
        stream = await client.completions.create(
            model=CAPABILITY,
            prompt=PROMPT,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]

    assert whole.object == "text_completion" and whole.model == CAPABILITY
    assert whole.choices[0].text == expected.text
    assert whole.choices[0].finish_reason == FINISH[expected.finish_reason]
    assert whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (
        expected.prompt_tokens,
        expected.completion_tokens,
    )
    *texts, finished, counted = chunks
    assert "".join(chunk.choices[0].text for chunk in texts) == expected.text
    assert finished.choices[0].finish_reason == FINISH[expected.finish_reason]
    assert counted.choices == [] and counted.usage is not None
    assert counted.usage.completion_tokens == expected.completion_tokens
    assert len({chunk.id for chunk in chunks}) == 1


async def test_chat_completions_whole_and_streamed_are_grpc_generates_chat_text(
    gantry: Harness,
) -> None:
    messages = [
        common_pb2.ChatMessage(role="system", content="Be brief."),
        common_pb2.ChatMessage(role="user", content=PROMPT),
    ]
    expected = await gantry.inference.Generate(
        inf.GenerateRequest(capability=CAPABILITY, messages=messages, max_tokens=16),
        metadata=gantry.client_md,
        timeout=60,
    )
    chat = [
        {"role": "developer", "content": "Be brief."},  # OpenAI's newer name for system
        {"role": "user", "content": [{"type": "text", "text": PROMPT}]},
    ]
    async with sdk(gantry) as client:
        whole = await client.chat.completions.create(
            model=CAPABILITY,
            messages=chat,  # type: ignore[arg-type]
            max_completion_tokens=16,
        )
        stream = await client.chat.completions.create(
            model=CAPABILITY,
            messages=chat,  # type: ignore[arg-type]
            max_tokens=16,
            stream=True,
        )
        chunks = [chunk async for chunk in stream]

    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content == expected.text
    assert whole.choices[0].finish_reason == FINISH[expected.finish_reason]
    first, *texts, finished = chunks
    assert first.choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in texts) == expected.text
    assert finished.choices[0].finish_reason == FINISH[expected.finish_reason]


async def test_the_handlers_own_validation_names_the_openai_parameter(gantry: Harness) -> None:
    async with sdk(gantry) as client:
        refusals = []
        for fields in (
            {"max_tokens": 100_000},  # past the control plane's limit
            {"temperature": 5.0},
            {"stop": ["x"] * 20},
            {"n": 2},  # OpenAI's, not Gantry's: refused unless it is the default
        ):
            with pytest.raises(openai.BadRequestError) as caught:
                await client.completions.create(
                    model=CAPABILITY,
                    prompt=PROMPT,
                    **fields,  # type: ignore[arg-type]
                )
            refusals.append((caught.value.status_code, caught.value.param))
        with pytest.raises(openai.BadRequestError) as wrong_role:
            await client.chat.completions.create(
                model=CAPABILITY,
                messages=[{"role": "tool", "content": "x", "tool_call_id": "1"}],
                stream=True,
            )
    assert refusals == [(400, "max_tokens"), (400, "temperature"), (400, "stop"), (400, "n")]
    assert wrong_role.value.param == "messages[0].tool_call_id"


async def test_no_max_tokens_means_up_to_the_deployments_bound_as_vllm_reads_it(
    gantry: Harness,
) -> None:
    # The SDK's and LangChain's ChatOpenAI() default: no max_tokens at all. The deployment allows
    # MAX_NEW_TOKENS, so the call gets exactly what naming that many gets (greedy: the same text).
    expected = await gantry.inference.Generate(
        inf.GenerateRequest(
            capability=CAPABILITY,
            messages=[common_pb2.ChatMessage(role="user", content=PROMPT)],
            max_tokens=MAX_NEW_TOKENS,
        ),
        metadata=gantry.client_md,
        timeout=60,
    )
    expected_completion = await gantry.inference.Generate(
        inf.GenerateRequest(capability=CAPABILITY, prompt=PROMPT, max_tokens=MAX_NEW_TOKENS),
        metadata=gantry.client_md,
        timeout=60,
    )
    chat = [{"role": "user", "content": PROMPT}]
    async with sdk(gantry) as client:
        whole = await client.chat.completions.create(
            model=CAPABILITY,
            messages=chat,  # type: ignore[arg-type]
        )
        stream = await client.chat.completions.create(
            model=CAPABILITY,
            messages=chat,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        completion = await client.completions.create(model=CAPABILITY, prompt=PROMPT)
        # An explicit count past the bound stays a refusal naming it, as vLLM refuses one past
        # the context.
        with pytest.raises(openai.BadRequestError) as past:
            await client.chat.completions.create(
                model=CAPABILITY,
                messages=chat,  # type: ignore[arg-type]
                max_completion_tokens=MAX_NEW_TOKENS + 1,
            )

    assert whole.choices[0].message.content == expected.text
    assert whole.choices[0].finish_reason == FINISH[expected.finish_reason]
    assert whole.usage is not None
    assert whole.usage.completion_tokens == expected.completion_tokens <= MAX_NEW_TOKENS
    counted = chunks[-1]
    assert counted.usage is not None
    assert counted.usage.completion_tokens == expected.completion_tokens
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == (
        expected.text
    )
    assert completion.choices[0].text == expected_completion.text
    assert completion.usage is not None
    assert completion.usage.completion_tokens == expected_completion.completion_tokens
    assert past.value.status_code == 400 and past.value.param == "max_tokens"
    assert past.value.code == "INVALID_PAYLOAD"
    assert f"at most {MAX_NEW_TOKENS}" in past.value.message

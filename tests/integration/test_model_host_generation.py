"""Text generation in a real model host child on a tiny random Llama, against transformers directly.

The host's greedy text, token counts and finish reason equal a direct `model.generate(...,
do_sample=False)` of the same model on the same prompt, and on the chat template's rendering of
the same messages; streamed deltas arrive in order and join to the final text; stop sequences end
the text before them; a seed makes sampling repeatable; max_tokens past the deployment's limit and
a prompt that fills the context are refused naming the field; a cancel stops a long generation
between two tokens, whether the ModelHost caller or the worker's Invocations gives up; the probe
check passes. Prints per-token latency of the host against a direct generate (run -s).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gantry.common.errors import FailureClass, GantryError
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.invocations import Invocations
from gantry.worker.model_host.adapters.causal_lm import DEFAULT_MAX_TOKENS
from gantry.worker.model_host.generation_serving import TEST_HOOK_SLOW_TOKENS_PROMPT
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost
from tests.fixtures.tiny_causal_lm import CONTEXT_LENGTH, DirectCausalLM
from tests.integration.generation_support import tokens_before_the_cancel
from tests.integration.harness import forked_host
from tests.integration.polling import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

MAX_NEW_TOKENS = 200  # the deployment's limit (AdapterSettings.max_new_tokens)
PROMPTS = ("Hello, world", "the quick brown fox", "Gantry serves models.")
CHAT = [
    common_pb2.ChatMessage(role="system", content="You are terse."),
    common_pb2.ChatMessage(role="user", content="Say something."),
]
STOP = common_pb2.FINISH_REASON_STOP
LENGTH = common_pb2.FINISH_REASON_LENGTH


# Direct generate's latency, measured in a child with the host's CPU settings (OMP_WAIT_POLICY
# PASSIVE: in this process torch's spinning OpenMP threads would slow it on a busy machine).
DIRECT_TIMING = r"""
import json, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
directory, prompts, max_new_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()
tokens, seconds = 0, 0.0
for round in range(2):  # the first round warms up
    for prompt in prompts:
        inputs = tokenizer(prompt, return_tensors="pt")
        started = time.perf_counter()
        with torch.inference_mode():
            output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        if round:
            seconds += time.perf_counter() - started
            tokens += output.shape[1] - inputs["input_ids"].shape[1]
print(json.dumps({"tokens": tokens, "seconds": seconds}))
"""


@pytest.fixture(scope="module")
def direct(tiny_causal_lm_dir: Path) -> DirectCausalLM:
    return DirectCausalLM(tiny_causal_lm_dir)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lm_host(tiny_causal_lm_dir: Path) -> AsyncIterator[ModelHost]:
    host = await forked_host(
        HostLaunchSpec(
            deployment_id="dep-causal-lm",
            model_directory=tiny_causal_lm_dir,
            adapter=common_pb2.AdapterSettings(
                adapter="transformers_causal_lm", device="cpu", max_new_tokens=MAX_NEW_TOKENS
            ),
            python_executable=sys.executable,
            test_hooks=True,
            load_timeout_s=120,
        )
    )
    try:
        yield host
    finally:
        await host.stop()


async def _generate(host: ModelHost, **fields: Any) -> wg.GenerateResult:
    return await host.generate(wg.GeneratePayload(**fields), trace_context={}, timeout_s=60)


async def _refusal(host: ModelHost, reason: str, **fields: Any) -> GantryError:
    with pytest.raises(GantryError) as caught:
        await _generate(host, **fields)
    assert caught.value.reason == reason, caught.value
    assert caught.value.failure_class is FailureClass.REQUEST
    return caught.value


async def test_greedy_text_equals_a_direct_generate_for_prompts_and_the_chat_template(
    lm_host: ModelHost, direct: DirectCausalLM
) -> None:
    finishes = set()
    for prompt, messages in [*((p, None) for p in PROMPTS), ("", CHAT)]:
        inputs = direct.inputs(prompt, messages)
        ids = direct.generate(inputs, 48)
        served = await _generate(lm_host, prompt=prompt, messages=messages, max_tokens=48)
        expected_finish = direct.finish_reason(ids)
        assert (served.text, served.completion_tokens, served.finish_reason) == (
            direct.text(ids),
            len(ids),
            expected_finish,
        )
        assert served.prompt_tokens == inputs["input_ids"].shape[1]
        finishes.add(served.finish_reason)
    # The comparison says something: the random model's texts differ, and some end by themselves.
    assert finishes == {STOP, LENGTH}


@pytest.fixture(scope="module")
def direct_timing(tiny_causal_lm_dir: Path) -> dict[str, Any]:
    arguments = [str(tiny_causal_lm_dir), json.dumps(PROMPTS), "48"]
    completed = subprocess.run(
        [sys.executable, "-I", "-c", DIRECT_TIMING, *arguments],
        capture_output=True,
        text=True,
        timeout=240,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"},
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    timed: dict[str, Any] = json.loads(completed.stdout)
    return timed


async def test_per_token_latency_of_the_host_against_direct_generate(
    lm_host: ModelHost, direct_timing: dict[str, Any]
) -> None:
    timed = direct_timing
    tokens, seconds = 0, 0.0
    for prompt in PROMPTS:
        for streamed in (False, True):
            started = time.perf_counter()
            served = await lm_host.generate(
                wg.GeneratePayload(prompt=prompt, max_tokens=48, stream=streamed),
                trace_context={},
                timeout_s=60,
                on_delta=lambda delta: None,
            )
            seconds += time.perf_counter() - started
            tokens += served.completion_tokens
    assert tokens == 2 * timed["tokens"]
    print(
        f"\ntiny causal LM, greedy: host {seconds * 1000 / tokens:.2f} ms per token (generate "
        f"and stream through the pipe, answers checked) vs direct generate "
        f"{timed['seconds'] * 1000 / timed['tokens']:.2f} ms per token"
    )


async def test_streamed_deltas_arrive_in_order_and_join_to_the_final_text(
    lm_host: ModelHost,
) -> None:
    texts = []
    for prompt in PROMPTS:
        deltas: list[wg.GenerateDelta] = []
        streamed = await lm_host.generate(
            wg.GeneratePayload(prompt=prompt, max_tokens=60, stream=True),
            trace_context={},
            timeout_s=60,
            on_delta=deltas.append,
        )
        plain = await _generate(lm_host, prompt=prompt, max_tokens=60)
        assert streamed == plain
        assert "".join(delta.text for delta in deltas) == streamed.text
        assert all(delta.text for delta in deltas)
        counts = [delta.completion_tokens for delta in deltas]
        assert counts == sorted(counts) and counts[-1] <= streamed.completion_tokens
        assert len(deltas) > 5
        # Half a character is held back until the next token completes it (or shows it invalid).
        assert not any(delta.text.endswith("\ufffd") for delta in deltas[:-1])
        texts.append(streamed.text)
    # The comparison says something: the random model did emit multi-byte characters' bytes.
    assert any(character in text for text in texts for character in ("€", "é", "\ufffd"))


async def test_stop_sequences_end_the_text_before_the_first_of_them(lm_host: ModelHost) -> None:
    prompt = PROMPTS[0]
    whole = await _generate(lm_host, prompt=prompt, max_tokens=60)
    assert whole.finish_reason == LENGTH and len(whole.text) > 30
    first, later = whole.text[20:23], whole.text[10:12]
    deltas: list[wg.GenerateDelta] = []
    stopped = await lm_host.generate(
        wg.GeneratePayload(prompt=prompt, max_tokens=60, stop=[first, later], stream=True),
        trace_context={},
        timeout_s=60,
        on_delta=deltas.append,
    )
    end = min(whole.text.index(first), whole.text.index(later))
    assert stopped.text == whole.text[:end]
    assert stopped.finish_reason == STOP
    assert stopped.completion_tokens < whole.completion_tokens
    assert "".join(delta.text for delta in deltas) == stopped.text


async def test_sampling_with_a_seed_repeats_its_text_and_another_seed_differs(
    lm_host: ModelHost,
) -> None:
    def sampled(seed: int) -> dict[str, Any]:
        sampling = common_pb2.SamplingSettings(temperature=1.0, top_p=0.95, top_k=40, seed=seed)
        return {"prompt": PROMPTS[1], "max_tokens": 40, "sampling": sampling}

    first, again, other = [await _generate(lm_host, **sampled(seed)) for seed in (7, 7, 8)]
    assert first == again
    assert first.text != other.text
    greedy = await _generate(lm_host, prompt=PROMPTS[1], max_tokens=40)
    assert first.text != greedy.text


async def test_max_tokens_past_the_limit_and_bad_sampling_are_refused_naming_the_field(
    lm_host: ModelHost, direct: DirectCausalLM
) -> None:
    error = await _refusal(lm_host, "INVALID_PAYLOAD", prompt="hi", max_tokens=MAX_NEW_TOKENS + 1)
    assert error.metadata == {
        "field": "max_tokens",
        "limit": str(MAX_NEW_TOKENS),
        "value": str(MAX_NEW_TOKENS + 1),
    }
    bad = common_pb2.SamplingSettings(temperature=-1)
    error = await _refusal(lm_host, "INVALID_PAYLOAD", prompt="hi", max_tokens=4, sampling=bad)
    assert error.metadata["field"] == "sampling.temperature"
    error = await _refusal(lm_host, "INVALID_PAYLOAD", max_tokens=4)
    assert error.metadata["field"] == "prompt"
    error = await _refusal(lm_host, "INVALID_PAYLOAD", prompt="hi", messages=CHAT, max_tokens=4)
    assert error.metadata["field"] == "messages"
    # A payload naming no max_tokens (the control plane always names one) gets the default.
    unbounded = await _generate(lm_host, prompt="hi", stop=["\x00"])
    room = CONTEXT_LENGTH - direct.inputs("hi")["input_ids"].shape[1]
    assert unbounded.completion_tokens == len(
        direct.generate(direct.inputs("hi"), min(DEFAULT_MAX_TOKENS, room))
    )
    # The host keeps serving.
    served = await _generate(lm_host, prompt="hi", max_tokens=3)
    assert served.text == direct.text(direct.generate(direct.inputs("hi"), 3))


async def test_a_prompt_that_fills_the_context_is_refused_and_one_near_it_ends_there(
    lm_host: ModelHost, direct: DirectCausalLM
) -> None:
    full = "x" * CONTEXT_LENGTH
    error = await _refusal(lm_host, "INPUT_TOO_LONG", prompt=full, max_tokens=10)
    tokens = direct.inputs(full)["input_ids"].shape[1]
    assert error.metadata == {
        "field": "prompt",
        "tokens": str(tokens),
        "limit": str(CONTEXT_LENGTH - 1),
    }
    near = "x" * (CONTEXT_LENGTH - 6)
    room = CONTEXT_LENGTH - direct.inputs(near)["input_ids"].shape[1]
    ended = await _generate(lm_host, prompt=near, max_tokens=50, stop=["\x00"])
    # What transformers alone makes with the room the context leaves: Gantry stops there too.
    ids = direct.generate(direct.inputs(near), min(50, room))
    expected_finish = direct.finish_reason(ids)
    assert (ended.completion_tokens, ended.finish_reason) == (len(ids), expected_finish)
    assert len(ids) <= room


async def test_a_cancelled_generation_stops_between_tokens_and_the_host_answers_at_once(
    lm_host: ModelHost,
) -> None:
    deltas: list[wg.GenerateDelta] = []
    started = asyncio.Event()

    def on_delta(delta: wg.GenerateDelta) -> None:
        deltas.append(delta)
        started.set()

    max_tokens = MAX_NEW_TOKENS
    slow = asyncio.create_task(
        lm_host.generate(
            wg.GeneratePayload(
                prompt=TEST_HOOK_SLOW_TOKENS_PROMPT, max_tokens=max_tokens, stream=True, stop=["\0"]
            ),
            trace_context={},
            timeout_s=120,
            on_delta=on_delta,
        )
    )
    await asyncio.wait_for(started.wait(), timeout=60)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    seen = deltas[-1].completion_tokens
    # One generation at a time: this is answered once the cancelled one has stopped.
    answered = await _generate(lm_host, prompt="hi", max_tokens=2)
    assert answered.completion_tokens >= 1
    # Said on the child's stderr before it answered; the parent reads that pipe on its own.
    await wait_until(
        lambda: tokens_before_the_cancel(lm_host.stderr_tail()) is not None,
        timeout_s=10,
        what="the host to log the cancelled generation",
    )
    # Stopped between two tokens by the cancel: had it run on, it would have made all of its
    # max_tokens (200 at TEST_HOOK_SLOW_TOKEN_S each) and answered them with LENGTH.
    made = tokens_before_the_cancel(lm_host.stderr_tail())
    assert made is not None and seen <= made < max_tokens, (seen, made)
    print(f"\nthe cancel stopped the generation after {made} of {max_tokens} tokens ({seen} seen)")


class _OneHost:
    def __init__(self, host: ModelHost) -> None:
        self.host = host

    def host_for_invoke(self, deployment_id: str) -> ModelHost:
        return self.host


async def test_a_streamed_invocation_sends_its_deltas_in_order_then_one_result(
    lm_host: ModelHost,
) -> None:
    messages: list[wg.InvokeProgress | wg.InvokeResult] = []
    answered = asyncio.Event()

    def emit(result: wg.InvokeResult) -> None:
        messages.append(result)
        answered.set()

    def emit_progress(progress: wg.InvokeProgress) -> bool:
        messages.append(progress)
        return True

    invocations = Invocations(
        supervisor=_OneHost(lm_host),  # type: ignore[arg-type]
        emit=emit,
        emit_progress=emit_progress,
    )
    invoke = wg.Invoke(
        request_id="inv-stream",
        deployment_id="dep-causal-lm",
        generate=wg.GeneratePayload(prompt=PROMPTS[2], max_tokens=40, stream=True),
    )
    invoke.timeout.FromSeconds(60)
    invocations.start(invoke, {})
    await asyncio.wait_for(answered.wait(), timeout=60)
    *progress, result = messages
    assert isinstance(result, wg.InvokeResult) and result.WhichOneof("outcome") == "generate"
    assert progress and all(isinstance(message, wg.InvokeProgress) for message in progress)
    assert {message.request_id for message in messages} == {"inv-stream"}
    joined = "".join(message.generate.text for message in progress)  # type: ignore[union-attr]
    assert joined == result.generate.text
    # Not streamed: the result alone.
    messages.clear()
    answered.clear()
    invoke.request_id = "inv-plain"
    invoke.generate.stream = False
    invocations.start(invoke, {})
    await asyncio.wait_for(answered.wait(), timeout=60)
    assert [type(message) for message in messages] == [wg.InvokeResult]
    assert messages[0].generate == result.generate  # type: ignore[union-attr]


async def test_cancel_invoke_stops_a_streamed_generation_in_the_host(lm_host: ModelHost) -> None:
    results: list[wg.InvokeResult] = []
    progress: list[wg.InvokeProgress] = []
    started = asyncio.Event()

    def emit_progress(message: wg.InvokeProgress) -> bool:
        progress.append(message)
        started.set()
        return True

    invocations = Invocations(
        supervisor=_OneHost(lm_host),  # type: ignore[arg-type]
        emit=results.append,
        emit_progress=emit_progress,
    )
    invoke = wg.Invoke(
        request_id="inv-slow",
        deployment_id="dep-causal-lm",
        generate=wg.GeneratePayload(
            prompt=TEST_HOOK_SLOW_TOKENS_PROMPT, max_tokens=MAX_NEW_TOKENS, stream=True, stop=["\0"]
        ),
    )
    invoke.timeout.FromSeconds(120)
    invocations.start(invoke, {})
    await asyncio.wait_for(started.wait(), timeout=60)
    assert invocations.cancel("inv-slow")
    await invocations.close()
    seen = progress[-1].generate.completion_tokens
    await _generate(lm_host, prompt="hi", max_tokens=2)  # answered once the slow one stopped
    await wait_until(
        lambda: tokens_before_the_cancel(lm_host.stderr_tail()) is not None,
        timeout_s=10,
        what="the host to log the cancelled generation",
    )
    # Stopped in the host by the cancel, not run on to its limit.
    made = tokens_before_the_cancel(lm_host.stderr_tail())
    assert made is not None and seen <= made < MAX_NEW_TOKENS, (seen, made)
    assert results == []  # the caller is gone: no InvokeResult


async def test_the_probe_check_passes_on_logits_and_a_real_generation(
    lm_host: ModelHost, direct: DirectCausalLM
) -> None:
    probe = await lm_host.probe_check(timeout_s=60)
    assert probe.health.model.status == wg.HEALTH_STATUS_OK, probe.health.model.detail
    assert "generated ids, all in the vocabulary" in probe.health.model.detail
    prompt_tokens = direct.inputs("Gantry model host health probe.")["input_ids"].shape[1]
    vocabulary = direct.model.config.vocab_size
    assert list(probe.output_shape) == [1, prompt_tokens, vocabulary] and probe.output_finite
    # Observed by the child: its weights read from the verified copy alone, no model code.
    assert list(probe.offline.weight_files) == ["model.safetensors"]
    assert not probe.offline.weight_files_outside_copy
    assert not probe.offline.remote_code_modules
    assert lm_host.ready.dim == 0
    assert {"torch", "transformers", "device"} <= set(lm_host.ready.runtime_versions)

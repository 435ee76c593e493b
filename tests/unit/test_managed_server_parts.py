"""The pure parts of managed servers: each kind's argv from the profile alone (vLLM's checked
statically: it does not install here), the loopback check over parsed /proc socket tables, the
OpenAI request bodies, and server-sent events folded into deltas and a result."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import NamedTuple

import psutil
import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.nodes.wire_bounds import CHARS_PER_TOKEN
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.artifact_copies import reader_of_copy
from gantry.worker.environment_facts import environment_from_facts
from gantry.worker.inspection import ArtifactFiles, inspect_artifact
from gantry.worker.managed_server.kinds import (
    LLAMA_CPP_SERVER,
    SERVER_KINDS,
    VLLM_SERVER,
    ServerInputs,
    gguf_model_file,
)
from gantry.worker.managed_server.loopback import (
    ListeningSocket,
    beyond_loopback,
    listening_of,
)
from gantry.worker.managed_server.openai_protocol import (
    CHAT_COMPLETIONS,
    COMPLETIONS,
    EXTRA_STREAM_EVENTS,
    MAX_EVENT_BYTES,
    RELAY_CHARS_PER_TOKEN,
    ServerFailed,
    SseDecoder,
    StreamAccumulator,
    completion_request,
)
from gantry.worker.managed_server.server_calls import offline_env_seen
from gantry.worker.model_host.environments import OFFLINE_ENVIRONMENT
from gantry.worker.runtime_adapters import runtime_adapter_for
from tests.fixtures.tiny_gguf import write_tiny_gguf


def _inputs(directory: Path, **settings: object) -> ServerInputs:
    return ServerInputs(
        python_executable="/envs/llama/bin/python",
        model_directory=directory,
        port=41234,
        settings=common_pb2.AdapterSettings(**settings),  # type: ignore[arg-type]
        served_name="dep-1",
    )


def test_llama_cpp_servers_argv_is_built_from_the_profile_and_the_one_gguf_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "m.Q8_0.gguf").write_bytes(b"GGUF")
    command = SERVER_KINDS[LLAMA_CPP_SERVER].command(
        _inputs(tmp_path, adapter=LLAMA_CPP_SERVER, max_input_length=512, device="cpu")
    )
    assert command.argv == (
        "/envs/llama/bin/python",
        "-I",
        "-m",
        "llama_cpp.server",
        "--model",
        str(tmp_path / "m.Q8_0.gguf"),
        "--model_alias",
        "dep-1",
        "--host",
        "127.0.0.1",
        "--port",
        "41234",
        "--n_ctx",
        "512",
        "--n_gpu_layers",
        "0",
        "--interrupt_requests",
        "false",
    )
    assert command.executable == "/envs/llama/bin/python"
    cuda = SERVER_KINDS[LLAMA_CPP_SERVER].command(_inputs(tmp_path, device="cuda:0"))
    assert cuda.argv[cuda.argv.index("--n_gpu_layers") + 1] == "-1"


def test_vllm_servers_argv_is_built_from_the_profile_statically(tmp_path: Path) -> None:
    command = SERVER_KINDS[VLLM_SERVER].command(
        _inputs(
            tmp_path, adapter=VLLM_SERVER, max_input_length=4096, max_concurrency=8, device="cuda"
        )
    )
    assert command.executable == "/envs/llama/bin/vllm"
    assert command.argv == (
        "/envs/llama/bin/vllm",
        "serve",
        str(tmp_path),
        "--served-model-name",
        "dep-1",
        "--host",
        "127.0.0.1",
        "--port",
        "41234",
        "--max-model-len",
        "4096",
        "--max-num-seqs",
        "8",
    )
    assert "--trust-remote-code" not in command.argv


def test_a_gguf_set_must_name_one_model_file(tmp_path: Path) -> None:
    with pytest.raises(GantryError) as none:
        gguf_model_file(tmp_path)
    assert none.value.reason == "RUNTIME_INCOMPATIBLE"
    for name in ("m-00001-of-00002.gguf", "m-00002-of-00002.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    assert gguf_model_file(tmp_path).name == "m-00001-of-00002.gguf"
    (tmp_path / "other.gguf").write_bytes(b"GGUF")
    (tmp_path / "other-00001-of-00002.gguf").write_bytes(b"GGUF")
    with pytest.raises(GantryError, match="exactly one"):
        gguf_model_file(tmp_path)


class _Row(NamedTuple):
    """The fields of psutil's `pconn` rows that the check reads."""

    laddr: tuple[str, int] | tuple[()]
    status: str


# One process's TCP rows as psutil lists them: 127.0.0.1:8080 and 0.0.0.0:9000 listening, one
# established; [::1]:8081, [::]:9001 and [::ffff:127.0.0.1]:8082 listening; a row with no address.
_ROWS = [
    _Row(("127.0.0.1", 8080), psutil.CONN_LISTEN),
    _Row(("0.0.0.0", 9000), psutil.CONN_LISTEN),
    _Row(("127.0.0.1", 8080), psutil.CONN_ESTABLISHED),
    _Row(("::1", 8081), psutil.CONN_LISTEN),
    _Row(("::", 9001), psutil.CONN_LISTEN),
    _Row(("::ffff:127.0.0.1", 8082), psutil.CONN_LISTEN),
    _Row((), psutil.CONN_LISTEN),
]


def test_a_processs_rows_give_its_listening_addresses() -> None:
    listening = listening_of(_ROWS)
    assert listening[:2] == [
        ListeningSocket(address=ipaddress.IPv4Address("127.0.0.1"), port=8080),
        ListeningSocket(address=ipaddress.IPv4Address("0.0.0.0"), port=9000),
    ]
    assert [(str(s.address), s.port) for s in listening[2:]] == [
        ("::1", 8081),
        ("::", 9001),
        ("::ffff:7f00:1", 8082),
    ]


def test_only_sockets_beyond_loopback_are_refused() -> None:
    listening = listening_of(_ROWS)
    # Loopback only (IPv4, IPv6 and IPv4-mapped): nothing to refuse.
    assert beyond_loopback([listening[i] for i in (0, 2, 4)]) == []
    # 0.0.0.0 and :: are every address.
    assert [s.describe() for s in beyond_loopback(listening)] == ["0.0.0.0:9000", "[::]:9001"]
    # Another process's wildcard socket is not the server's: psutil lists each process's own
    # sockets (tests/integration/test_loopback_listeners.py checks it against a real one).


def test_a_prompt_goes_to_completions_with_explicit_off_values() -> None:
    request = completion_request(
        wg.GeneratePayload(prompt="hi", max_tokens=5, stop=["\n"], stream=True),
        model="dep",
        max_new_tokens=0,
        top_k_off=0,
        neutral_sampling={"repeat_penalty": 1.0},
    )
    assert (request.path, request.chat) == (COMPLETIONS, False)
    assert request.body == {
        "repeat_penalty": 1.0,
        "model": "dep",
        "max_tokens": 5,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "stop": ["\n"],
        "prompt": "hi",
    }
    chat = completion_request(
        wg.GeneratePayload(messages=[common_pb2.ChatMessage(role="user", content="x")]),
        model="dep",
        max_new_tokens=100,
        top_k_off=-1,
    )
    assert chat.path == CHAT_COMPLETIONS and chat.body["messages"] == [
        {"role": "user", "content": "x"}
    ]
    assert (chat.body["max_tokens"], chat.body["top_k"]) == (100, -1)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (wg.GeneratePayload(), "prompt"),
        (
            wg.GeneratePayload(prompt="a", messages=[common_pb2.ChatMessage(role="user")]),
            "messages",
        ),
        (wg.GeneratePayload(prompt="a", max_tokens=11), "max_tokens"),
        (wg.GeneratePayload(prompt="a", stop=[""]), "stop[0]"),
        (
            wg.GeneratePayload(prompt="a", sampling=common_pb2.SamplingSettings(temperature=-1)),
            "sampling.temperature",
        ),
    ],
)
def test_a_payload_the_server_must_not_see_is_invalid(
    payload: wg.GeneratePayload, field: str
) -> None:
    with pytest.raises(GantryError) as refused:
        completion_request(payload, model="m", max_new_tokens=10, top_k_off=0)
    assert refused.value.reason == "INVALID_PAYLOAD"
    assert refused.value.metadata["field"] == field


def test_server_sent_events_split_anywhere_fold_into_deltas_and_a_result() -> None:
    stream = (
        b'data: {"choices": [{"text": "he", "finish_reason": null}]}\r\n\r\n'
        b": a comment\n\n"
        b'data: {"choices": [{"text": "llo", "finish_reason": null}]}\n\n'
        b'data: {"choices": [{"text": "", "finish_reason": "length"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    decoder = SseDecoder()
    accumulated = StreamAccumulator(chat=False)
    deltas = []
    for index in range(0, len(stream), 7):  # chunks that cut lines and events apart
        for data in decoder.feed(stream[index : index + 7]):
            delta = accumulated.event(data)
            if delta is not None:
                deltas.append((delta.text, delta.completion_tokens))
    assert deltas == [("he", 1), ("llo", 2)]
    assert accumulated.done
    assert accumulated.result() == wg.GenerateResult(
        text="hello",
        finish_reason=common_pb2.FINISH_REASON_LENGTH,
        prompt_tokens=0,  # no usage streamed: unknown, not guessed
        completion_tokens=2,
    )


def test_a_streamed_chat_with_usage_reports_the_servers_counts() -> None:
    accumulated = StreamAccumulator(chat=True)
    accumulated.event('{"choices": [{"delta": {"role": "assistant"}}]}')
    accumulated.event('{"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}')
    accumulated.event('{"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}}')
    result = accumulated.result()
    assert (result.text, result.finish_reason) == ("ok", common_pb2.FINISH_REASON_STOP)
    assert (result.prompt_tokens, result.completion_tokens) == (7, 1)
    with pytest.raises(ServerFailed) as failed:
        accumulated.event('{"error": {"message": "boom"}}')
    # The server's words are kept apart: the caller decides who may read them.
    assert (failed.value.status, failed.value.said) == (0, "boom")


def _text_event(text: str, **extra: object) -> str:
    return json.dumps({"choices": [{"text": text, "finish_reason": None}], **extra})


def test_a_stream_past_max_tokens_chunks_is_cut_with_a_length_finish() -> None:
    accumulated = StreamAccumulator(chat=False, max_tokens=3)
    deltas = [accumulated.event(_text_event("a")) for _ in range(3)]
    assert [d.completion_tokens for d in deltas if d is not None] == [1, 2, 3]
    assert not accumulated.done
    assert accumulated.event(_text_event("b")) is None  # a fourth chunk: never relayed
    assert accumulated.done and accumulated.cut
    assert accumulated.event(_text_event("c")) is None  # nothing is read after the cut
    assert accumulated.result() == wg.GenerateResult(
        text="aaa", finish_reason=common_pb2.FINISH_REASON_LENGTH, completion_tokens=3
    )


def test_an_honest_stream_of_exactly_max_tokens_is_not_cut() -> None:
    accumulated = StreamAccumulator(chat=True, max_tokens=2)
    accumulated.event('{"choices": [{"delta": {"role": "assistant"}}]}')
    accumulated.event('{"choices": [{"delta": {"content": "a"}}]}')
    accumulated.event('{"choices": [{"delta": {"content": "b"}, "finish_reason": "length"}]}')
    accumulated.event('{"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}')
    accumulated.event("[DONE]")
    assert accumulated.done and not accumulated.cut
    assert accumulated.result() == wg.GenerateResult(
        text="ab",
        finish_reason=common_pb2.FINISH_REASON_LENGTH,
        prompt_tokens=4,
        completion_tokens=2,
    )


@pytest.mark.parametrize(
    "past",
    [
        # The server's own count past the bound: that event is dropped.
        _text_event("b", usage={"prompt_tokens": 1, "completion_tokens": 9}),
        # More text than the bound relays (RELAY_CHARS_PER_TOKEN a token).
        _text_event("x" * (4 * RELAY_CHARS_PER_TOKEN)),
    ],
)
def test_a_stream_past_its_token_count_or_text_bound_is_cut(past: str) -> None:
    accumulated = StreamAccumulator(chat=False, max_tokens=4)
    accumulated.event(_text_event("a"))
    assert accumulated.event(past) is None
    assert accumulated.cut
    result = accumulated.result()
    assert (result.text, result.completion_tokens) == ("a", 1)
    assert result.finish_reason == common_pb2.FINISH_REASON_LENGTH


def test_a_stream_of_events_without_text_is_cut_after_a_few_beyond_max_tokens() -> None:
    accumulated = StreamAccumulator(chat=True, max_tokens=2)
    empty = '{"choices": [{"delta": {}}]}'
    for _ in range(2 + EXTRA_STREAM_EVENTS):
        accumulated.event(empty)
    assert not accumulated.done
    accumulated.event(empty)
    assert accumulated.cut and accumulated.result().completion_tokens == 0


def test_a_server_sent_line_without_end_is_refused_not_held() -> None:
    decoder = SseDecoder()
    decoder.feed(b"data: " + b"x" * (MAX_EVENT_BYTES // 2))
    with pytest.raises(GantryError) as refused:
        decoder.feed(b"x" * (MAX_EVENT_BYTES // 2 + 16))
    assert refused.value.reason == "INVOKE_FAILED"


def test_the_relayed_text_bound_is_the_control_planes_wire_bound() -> None:
    assert RELAY_CHARS_PER_TOKEN == CHARS_PER_TOKEN


def test_environment_facts_list_a_server_kind_only_where_the_script_found_it() -> None:
    facts = {
        "versions": {"python": "3.11.7", "llama-cpp-python": "0.3.36"},
        "adapters": [LLAMA_CPP_SERVER],
    }
    environment = environment_from_facts("llama", "/envs/llama/bin/python", facts)
    assert list(environment.adapters) == [LLAMA_CPP_SERVER]
    vllm = runtime_adapter_for(VLLM_SERVER).collect_runtime_facts(facts)
    assert not vllm.available and "vllm" in vllm.reason


def test_llama_cpp_server_runs_gguf_generation_layouts() -> None:
    adapter = runtime_adapter_for(LLAMA_CPP_SERVER)
    assert adapter.inspect_support(wg.Inspection(inspector="gguf", task="generation")).supported
    refused = adapter.inspect_support(wg.Inspection(inspector="transformers", task="generation"))
    assert not refused.supported and "not transformers" in refused.reason


def test_a_gguf_is_executable_where_the_environment_runs_the_llama_cpp_server(
    tmp_path: Path,
) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf")
    sizes = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    inspection = inspect_artifact(
        ArtifactFiles(sizes, reader_of_copy(tmp_path)),
        environment_id="llama",
        environment_adapters=[LLAMA_CPP_SERVER],
    )
    assert list(inspection.adapters) == [LLAMA_CPP_SERVER] and inspection.executable
    assert not any("does not run" in f.message for f in inspection.findings)


def test_a_servers_offline_flags_are_read_from_its_environment_block() -> None:
    block = b"PATH=/bin\0HF_HUB_OFFLINE=1\0TRANSFORMERS_OFFLINE=0\0"
    seen = offline_env_seen(block, unreadable="")
    assert set(seen) == set(OFFLINE_ENVIRONMENT)
    assert (seen["HF_HUB_OFFLINE"], seen["TRANSFORMERS_OFFLINE"]) == ("1", "0")
    assert seen["HF_DATASETS_OFFLINE"] == "unset"  # what the child lacks, never the constant
    unreadable = offline_env_seen(None, unreadable="/proc/7/environ: Permission denied")
    assert set(unreadable.values()) == {"unavailable: /proc/7/environ: Permission denied"}

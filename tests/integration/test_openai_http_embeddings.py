"""The OpenAI-compatible HTTP API's embeddings, models and refusals, driven by the real `openai` SDK
(and curl, as the docs show it) against an in-process Gantry serving HTTP on port 0, on SQLite and
PostgreSQL.

The vectors are gRPC Embed's own, bit for bit, whether the SDK asks for floats or (its default)
base64; the model is the capability; a wrong key, an unknown capability, a malformed body and a
body past the bound are refused with the HTTP status and the OpenAI error shape, `code` holding
Gantry's reason; a text past the model's token limit is refused naming `truncate`, which the door
takes; a W3C `traceparent` header becomes the parent of the call's spans.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import openai
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gantry.controlplane.app import INFERENCE_PREFIX, front_door_limits
from gantry.controlplane.serving.inference_service import InferenceSettings
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness, running_gantry

CAPABILITY = "tiny-embed"
TEXTS = ["Gantry keeps models resident.", "A second sentence, a second vector."]
# The gRPC Inference door's request bound (sized to the largest legal media call): the HTTP
# body's bound too.
BODY_BOUND = front_door_limits(InferenceSettings())[INFERENCE_PREFIX].max_request_bytes or 0
_EXPORTER = InMemorySpanExporter()


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path, tiny_model_dir: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root, http_listen="127.0.0.1:0") as harness:
        await harness.start_worker(await harness.register_node("http-node"))
        artifact = await harness.register_model(tiny_model_dir, "tiny")
        created = await harness.deploy(artifact.artifact_set_id, CAPABILITY)
        await harness.wait_deployment(created.deployment_id, cp.DEPLOYMENT_STATE_READY)
        yield harness


def base_url(harness: Harness) -> str:
    assert harness.control_plane.http_api is not None
    return f"http://127.0.0.1:{harness.control_plane.http_api.port}/v1"


def sdk(harness: Harness, *, api_key: str | None = None) -> openai.AsyncOpenAI:
    # No retries: a refusal must be seen as it was answered, once.
    return openai.AsyncOpenAI(
        base_url=base_url(harness), api_key=api_key or harness.api_key, max_retries=0
    )


async def grpc_vectors(harness: Harness, texts: list[str]) -> list[list[float]]:
    answer = await harness.inference.Embed(
        inf.EmbedRequest(capability=CAPABILITY, inputs=texts), metadata=harness.client_md
    )
    return [list(vector.values) for vector in answer.vectors]


async def test_the_sdk_embeds_the_vectors_grpc_embed_gives_and_lists_the_capability(
    gantry: Harness,
) -> None:
    expected = await grpc_vectors(gantry, TEXTS)
    async with sdk(gantry) as client:
        as_base64 = await client.embeddings.create(model=CAPABILITY, input=TEXTS)  # the default
        as_floats = await client.embeddings.create(
            model=CAPABILITY, input=TEXTS, encoding_format="float"
        )
        one = await client.embeddings.create(model=CAPABILITY, input=TEXTS[0])
        models = await client.models.list()
        model = await client.models.retrieve(CAPABILITY)

    for answer in (as_base64, as_floats):
        assert answer.model == CAPABILITY
        assert [item.index for item in answer.data] == [0, 1]
        assert [item.embedding for item in answer.data] == expected  # bit for bit
        # Gantry counts no tokens for embeddings: 0, never an estimate.
        assert (answer.usage.prompt_tokens, answer.usage.total_tokens) == (0, 0)
    assert [item.embedding for item in one.data] == expected[:1]

    listed = {entry.id: entry for entry in models.data}
    assert CAPABILITY in listed and listed[CAPABILITY].owned_by == "gantry"
    assert model.id == CAPABILITY and model.created > 0
    assert (model.model_extra or {})["gantry"]["state"] == "READY"


async def test_refusals_carry_the_http_status_and_gantrys_reason_as_code(gantry: Harness) -> None:
    async with sdk(gantry, api_key="api_key_0_not-a-real-key") as stranger:
        with pytest.raises(openai.AuthenticationError) as unauthenticated:
            await stranger.embeddings.create(model=CAPABILITY, input="hello")
    assert unauthenticated.value.status_code == 401
    assert unauthenticated.value.code == "UNAUTHENTICATED"

    async with sdk(gantry) as client:
        with pytest.raises(openai.NotFoundError) as unknown:
            await client.embeddings.create(model="no-such-capability", input="hello")
        assert unknown.value.code == "NOT_FOUND"
        with pytest.raises(openai.BadRequestError) as empty:
            await client.embeddings.create(model=CAPABILITY, input=["fine", ""])
        # Gantry's own validation, its field in OpenAI's spelling.
        assert (empty.value.code, empty.value.param) == ("EMPTY_INPUT", "input[1]")

    async with httpx2.AsyncClient(base_url=base_url(gantry)) as http:
        key = {"authorization": f"Bearer {gantry.api_key}"}
        malformed = await http.post("/embeddings", content=b'{"model": ', headers=key)
        assert malformed.status_code == 400
        error = malformed.json()["error"]
        assert error["code"] == "INVALID_ARGUMENT" and "not valid JSON" in error["message"]
        assert error["type"] == "invalid_request_error"

        wrong_type = await http.post(
            "/embeddings", json={"model": CAPABILITY, "input": [1, 2, 3]}, headers=key
        )
        assert wrong_type.status_code == 400
        assert wrong_type.json()["error"]["param"] == "input[0]"

        no_key = await http.get("/models")
        assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "UNAUTHENTICATED"

        too_large = await http.post("/embeddings", content=b"x" * (BODY_BOUND + 1), headers=key)
        assert too_large.status_code == 413
        assert too_large.json()["error"]["code"] == "INVALID_ARGUMENT"

        unknown_route = await http.get("/engines", headers=key)
        assert unknown_route.status_code == 404
        assert unknown_route.json()["error"]["code"] == "NOT_FOUND"


async def test_an_over_long_text_is_refused_naming_truncate_which_the_door_takes(
    gantry: Harness,
) -> None:
    long_text = "resident " * 400  # far past the tiny model's 128 tokens
    async with sdk(gantry) as client:
        with pytest.raises(openai.BadRequestError) as too_long:
            await client.embeddings.create(model=CAPABILITY, input=["fine", long_text])
        # The option the refusal names is one this door takes (a Gantry field beside OpenAI's).
        cut = await client.embeddings.create(
            model=CAPABILITY,
            input=["fine", long_text],
            encoding_format="float",
            extra_body={"truncate": True},
        )
    assert (too_long.value.code, too_long.value.param) == ("INPUT_TOO_LONG", "input[1]")
    assert "set truncate to cut it to the limit" in too_long.value.message
    expected = await gantry.inference.Embed(
        inf.EmbedRequest(capability=CAPABILITY, inputs=["fine", long_text], truncate=True),
        metadata=gantry.client_md,
    )
    assert [item.embedding for item in cut.data] == [
        list(vector.values) for vector in expected.vectors
    ]


async def test_curl_as_the_docs_show_it(gantry: Harness) -> None:
    # A child process, awaited: the server answering it runs in this test's event loop.
    curl = await asyncio.create_subprocess_exec(
        "curl", "-sS", f"{base_url(gantry)}/embeddings",
        "-H", f"Authorization: Bearer {gantry.api_key}",
        "-H", "Content-Type: application/json",
        "-d", json.dumps({"model": CAPABILITY, "input": TEXTS[0]}),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(curl.communicate(), 30)
    assert curl.returncode == 0, err
    answer = json.loads(out)
    assert answer["object"] == "list" and answer["model"] == CAPABILITY
    assert [item["embedding"] for item in answer["data"]] == await grpc_vectors(gantry, TEXTS[:1])


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    return _EXPORTER


async def test_a_traceparent_header_is_the_parent_of_the_calls_spans(
    exporter: InMemorySpanExporter, gantry: Harness
) -> None:
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    exporter.clear()
    async with httpx2.AsyncClient(base_url=base_url(gantry)) as http:
        answered = await http.post(
            "/embeddings",
            json={"model": CAPABILITY, "input": "follow me"},
            headers={
                "authorization": f"Bearer {gantry.api_key}",
                "traceparent": f"00-{trace_id}-{parent_id}-01",
            },
        )
    assert answered.status_code == 200
    spans = {span.name: span for span in exporter.get_finished_spans()}
    door, embed = spans["POST /v1/embeddings"], spans["controlplane.embed"]
    assert door.context.trace_id == embed.context.trace_id == int(trace_id, 16)
    assert door.parent is not None and door.parent.span_id == int(parent_id, 16)
    assert embed.parent is not None and embed.parent.span_id == door.context.span_id
    assert door.attributes is not None and door.attributes["gantry.protocol"] == "openai_http"

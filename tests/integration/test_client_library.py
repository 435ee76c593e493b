"""gantry.client against a real plane: an in-process Gantry (control plane, scheduler, a worker
with real model hosts) serving the tiny embedder ("minilm"), the tiny cross-encoder ("rerank")
and the tiny causal LM ("tiny-chat"). The blocking Client and the AsyncClient answer what the raw
generated stubs answer (the same vectors, to float rounding: tests/fixtures/vectors.py; the same
ranking; the same text, whole or streamed), raise typed errors carrying the server's reason,
balance over several addresses (one of them dead) and run README's "Python client" block and
docs/client.md's blocks as pasted.

The control plane runs in this test's event loop, so a blocking call goes through a thread.
"""

from __future__ import annotations

import asyncio
import re
import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import grpc
import numpy as np
import pytest
import pytest_asyncio

import gantry.client
from gantry.client import AsyncClient, Client
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.fixtures.vectors import assert_same_vectors
from tests.integration.harness import Harness, running_gantry
from tests.integration.module_databases import module_database

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[2]
README, DOC = REPO / "README.md", REPO / "docs" / "client.md"
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
DEFAULT_ADDRESS = "127.0.0.1:50051"
READY = cp.DEPLOYMENT_STATE_READY
TEXTS = ["the gantry moves models", "a second sentence", "ünïcode survives"]
QUERY = "the quick brown fox"
DOCUMENTS = ["the quick brown fox jumps over the lazy dog", "hello world", "red green blue"]
PROMPT = "the gantry"
MAX_TOKENS = 6
CROSS_ENCODER = "sentence_transformers_cross_encoder"
T = TypeVar("T")


async def _ready(harness: Harness, model_dir: Path, capability: str, **adapter: object) -> None:
    artifact = await harness.register_model(model_dir, capability)
    created = await harness.deploy(artifact.artifact_set_id, capability, **adapter)
    await harness.wait_deployment(created.deployment_id, READY, timeout=180)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gantry_plane(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model_dir: Path,
    tiny_cross_encoder_dir: Path,
    tiny_causal_lm_dir: Path,
) -> AsyncIterator[Harness]:
    directory = tmp_path_factory.mktemp("client-library")
    (directory / "artifacts").mkdir()
    async with (
        module_database("sqlite", directory) as database_url,
        running_gantry(database_url, directory / "artifacts") as harness,
    ):
        await harness.start_worker(await harness.register_node("client-node"))
        # The three walk their gates at once, on the one worker.
        await asyncio.gather(
            _ready(harness, tiny_model_dir, "minilm"),
            _ready(harness, tiny_cross_encoder_dir, "rerank", adapter=CROSS_ENCODER),
            _ready(
                harness,
                tiny_causal_lm_dir,
                "tiny-chat",
                adapter="transformers_causal_lm",
                device="cpu",
                max_new_tokens=16,
            ),
        )
        yield harness


async def _blocking(harness: Harness, use: Callable[[Client], T], **options: object) -> T:
    """`use` of a blocking Client of the plane, in a thread (the plane runs in this loop)."""

    def run() -> T:
        with Client(harness.address, api_key=harness.api_key, **options) as client:  # type: ignore[arg-type]
            return use(client)

    return await asyncio.to_thread(run)


async def _raw_vectors(harness: Harness, texts: list[str]) -> np.ndarray:
    response = await harness.inference.Embed(
        inf.EmbedRequest(capability="minilm", inputs=texts), metadata=harness.client_md
    )
    return np.array([list(vector.values) for vector in response.vectors], dtype=np.float32)


async def test_embed_answers_the_raw_stubs_vectors(gantry_plane: Harness) -> None:
    expected = await _raw_vectors(gantry_plane, TEXTS)
    blocking = await _blocking(gantry_plane, lambda client: client.embed("minilm", TEXTS))
    async with AsyncClient(gantry_plane.address, api_key=gantry_plane.api_key) as client:
        awaited = await client.embed("minilm", TEXTS)
    for got in (blocking, awaited):
        assert got.dtype == np.float32 and got.shape == expected.shape == (3, expected.shape[1])
        assert_same_vectors(got, expected)  # separate calls: to float rounding


async def test_rerank_orders_as_the_raw_stub(gantry_plane: Harness) -> None:
    raw = await gantry_plane.inference.Rerank(
        inf.RerankRequest(capability="rerank", query=QUERY, documents=DOCUMENTS),
        metadata=gantry_plane.client_md,
    )
    expected = [(r.index, DOCUMENTS[r.index], r.score) for r in raw.results]
    blocking = await _blocking(
        gantry_plane, lambda client: client.rerank("rerank", QUERY, DOCUMENTS)
    )
    async with AsyncClient(gantry_plane.address, api_key=gantry_plane.api_key) as client:
        best = await client.rerank("rerank", QUERY, DOCUMENTS, top_n=1)
    assert [(r.index, r.document, r.score) for r in blocking] == expected
    assert len(blocking) == len(DOCUMENTS) and best == blocking[:1]


async def test_a_generation_whole_and_streamed_is_the_same_text(gantry_plane: Harness) -> None:
    def both(client: Client) -> tuple[inf.GenerateResponse, list[inf.GenerateChunk]]:
        whole = client.generate("tiny-chat", PROMPT, max_tokens=MAX_TOKENS)
        return whole, list(client.generate_stream("tiny-chat", PROMPT, max_tokens=MAX_TOKENS))

    whole, chunks = await _blocking(gantry_plane, both)
    async with AsyncClient(gantry_plane.address, api_key=gantry_plane.api_key) as client:
        awaited = await client.generate("tiny-chat", PROMPT, max_tokens=MAX_TOKENS)
        streamed = [
            chunk
            async for chunk in client.generate_stream("tiny-chat", PROMPT, max_tokens=MAX_TOKENS)
        ]
    assert whole.text and 0 < whole.completion_tokens <= MAX_TOKENS
    assert whole.finish_reason in (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH)
    for parts in (chunks, streamed):
        assert "".join(chunk.text for chunk in parts) == whole.text
        assert parts[-1].finish_reason == whole.finish_reason
    assert awaited.text == whole.text


async def test_failures_raise_typed_errors_with_the_servers_reason(gantry_plane: Harness) -> None:
    def unknown(client: Client) -> None:
        client.embed("no-such-capability", ["x"])

    def unknown_stream(client: Client) -> None:
        list(client.generate_stream("no-such-capability", PROMPT))

    with pytest.raises(gantry.client.NotFound):
        await _blocking(gantry_plane, unknown_stream)
    with pytest.raises(gantry.client.NotFound) as caught:
        await _blocking(gantry_plane, unknown)
    assert caught.value.reason == "NOT_FOUND"
    assert caught.value.code is grpc.StatusCode.NOT_FOUND
    assert caught.value.metadata["capability"] == "no-such-capability"

    async with AsyncClient(gantry_plane.address, api_key=gantry_plane.api_key) as client:
        with pytest.raises(gantry.client.InvalidArgument) as empty:
            await client.embed("minilm", [""])
        with pytest.raises(gantry.client.NotFound):
            async for _ in client.generate_stream("no-such-capability", PROMPT):
                pass
        # A deadline no generation can meet.
        with pytest.raises(gantry.client.DeadlineExceeded) as late:
            await client.generate("tiny-chat", PROMPT, max_tokens=MAX_TOKENS, timeout=0.001)
    assert empty.value.reason == "EMPTY_INPUT" and empty.value.metadata
    assert late.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    async with AsyncClient(gantry_plane.address, api_key="gk_not_a_key") as stranger:
        with pytest.raises(gantry.client.Unauthenticated) as refused:
            await stranger.embed("minilm", ["x"])
    assert refused.value.reason == "UNAUTHENTICATED"


def _dead_address() -> str:
    """A port that was free a moment ago: nothing listens there."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


async def test_several_addresses_one_dead_and_the_key_from_the_environment(
    gantry_plane: Harness,
) -> None:
    expected = await _raw_vectors(gantry_plane, TEXTS[:1])
    addresses = [_dead_address(), gantry_plane.address, _dead_address()]
    env = {gantry.client.API_KEY_ENV: gantry_plane.api_key}

    def embeds(client: Client) -> list[np.ndarray]:
        return [client.embed("minilm", TEXTS[:1]) for _ in range(6)]

    def joined() -> list[np.ndarray]:
        # One comma-separated string; no api_key=: the environment's key.
        with Client(",".join(addresses), env=env) as client:
            return embeds(client)

    blocking = await asyncio.to_thread(joined)
    async with AsyncClient(addresses, env=env) as client:
        awaited = [await client.embed("minilm", TEXTS[:1]) for _ in range(6)]
    for got in (*blocking, *awaited):
        assert_same_vectors(got, expected)


async def test_the_readme_and_docs_blocks_run_as_pasted(
    gantry_plane: Harness, tmp_path: Path
) -> None:
    section = README.read_text().split("## Python client\n", 1)[1].split("\n## ", 1)[0]
    readme, docs = PYTHON_BLOCK.findall(section), PYTHON_BLOCK.findall(DOC.read_text())
    assert (len(readme), len(docs)) == (1, 3)
    blocks: list[str] = [*readme, *docs]
    assert all(DEFAULT_ADDRESS in block for block in blocks)
    state = tmp_path / ".gantry"
    state.mkdir()
    (state / "client.key").write_text(gantry_plane.api_key + "\n")
    outputs = []
    for block in blocks:
        # Only the address differs from `make run`'s: this Gantry listens on an ephemeral port.
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            block.replace(DEFAULT_ADDRESS, gantry_plane.address),
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(child.communicate(), timeout=120)
        assert child.returncode == 0, err.decode()
        outputs.append(out.decode())
    dim = (await _raw_vectors(gantry_plane, ["x"])).shape[1]
    # README's, then docs/client.md's: the blocking example, the asyncio one, the stream.
    for blocking in outputs[:2]:
        assert f"(2, {dim}) float32\nNOT_FOUND no-such-capability\n" == blocking
    assert f"(1, {dim})" in outputs[2]
    assert re.search(r"\n\[[12], \d+ tokens\]\n$", outputs[3]), outputs[3]

"""Inference.Rerank end to end: control plane, scheduler, worker and a cross-encoder model host.

The reference is sentence-transformers' own `CrossEncoder.predict` on the same tiny model in this
process: Gantry must return the same scores (within float tolerance) in exactly the same order.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from gantry.common.errors import GantryError
from gantry.common.inference_limits import MAX_INPUTS
from gantry.common.status import error_info_of
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.worker.model_host.process import HostLaunchSpec
from tests.integration.harness import Harness, forked_host, running_gantry

READY = cp.DEPLOYMENT_STATE_READY
CROSS_ENCODER = "sentence_transformers_cross_encoder"
QUERY = "the quick brown fox"
DOCUMENTS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world",
    "red green blue",
    "one two three four",
    "model host gantry worker",
    "cat runs fast",
    "health probe sentence",
    "the a an",
]


def _direct_scores(model_dir: Path, query: str, documents: list[str]) -> np.ndarray:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(model_dir), device="cpu", local_files_only=True)
    return np.asarray(model.predict([(query, document) for document in documents]))


def _expected_order(scores: np.ndarray) -> list[int]:
    return sorted(range(len(scores)), key=lambda index: (-float(scores[index]), index))


async def _deploy(
    harness: Harness, model_dir: Path, capability: str, adapter: str
) -> cp.Deployment:
    artifact = await harness.register_model(model_dir, capability)
    deployment = await harness.deploy(artifact.artifact_set_id, capability, adapter=adapter)
    return await harness.wait_deployment(deployment.deployment_id, READY)


@pytest.fixture
async def gantry(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        yield harness


async def _code_and_reason(call) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info_of(caught.value)
    return caught.value.code(), info.reason if info else ""


async def test_rerank_orders_documents_exactly_as_cross_encoder_predict(
    database_url: str, tmp_path: Path, tiny_cross_encoder_dir: Path
) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root) as harness:
        await harness.start_worker(await harness.register_node("node-rerank"))
        deployment = await _deploy(harness, tiny_cross_encoder_dir, "rerank-tiny", CROSS_ENCODER)
        expected_scores = _direct_scores(tiny_cross_encoder_dir, QUERY, DOCUMENTS)
        expected = _expected_order(expected_scores)
        # The fixture's scores are far apart, so the order is not decided by float noise.
        assert np.diff(np.sort(expected_scores)).min() > 1e-4

        response = await harness.inference.Rerank(
            inf.RerankRequest(capability="rerank-tiny", query=QUERY, documents=DOCUMENTS),
            metadata=harness.client_md,
        )
        assert [result.index for result in response.results] == expected
        np.testing.assert_allclose(
            [result.score for result in response.results],
            expected_scores[expected],
            rtol=0,
            atol=1e-5,
        )
        assert response.deployment_id == deployment.deployment_id
        assert response.node_id == deployment.residencies[0].node_id

        # By deployment id, only the best three.
        top = await harness.inference.Rerank(
            inf.RerankRequest(
                deployment_id=deployment.deployment_id,
                query=QUERY,
                documents=DOCUMENTS,
                top_n=3,
            ),
            metadata=harness.client_md,
        )
        assert [result.index for result in top.results] == expected[:3]

        # top_n beyond the documents is every document; one document is a ranking of one.
        everything = await harness.inference.Rerank(
            inf.RerankRequest(
                capability="rerank-tiny", query=QUERY, documents=DOCUMENTS, top_n=100
            ),
            metadata=harness.client_md,
        )
        assert [result.index for result in everything.results] == expected
        single = await harness.inference.Rerank(
            inf.RerankRequest(capability="rerank-tiny", query=QUERY, documents=["hello world"]),
            metadata=harness.client_md,
        )
        assert [result.index for result in single.results] == [0]
        assert single.results[0].score == pytest.approx(expected_scores[1], abs=1e-5)


async def test_wrong_kind_and_malformed_requests_get_typed_errors_and_serving_continues(
    gantry: Harness, tiny_model_dir: Path, tiny_cross_encoder_dir: Path
) -> None:
    await gantry.start_worker(await gantry.register_node("node-kinds"))
    await _deploy(gantry, tiny_cross_encoder_dir, "rerank-tiny", CROSS_ENCODER)
    await _deploy(gantry, tiny_model_dir, "embed-tiny", "sentence_transformers")
    rerank, embed, md = gantry.inference.Rerank, gantry.inference.Embed, gantry.client_md

    # A rerank sent to an embedding deployment, and an embed sent to a cross-encoder.
    code, reason = await _code_and_reason(
        rerank(
            inf.RerankRequest(capability="embed-tiny", query=QUERY, documents=DOCUMENTS),
            metadata=md,
        )
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAYLOAD")
    code, reason = await _code_and_reason(
        embed(inf.EmbedRequest(capability="rerank-tiny", inputs=["hello world"]), metadata=md)
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAYLOAD")

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await rerank(
            inf.RerankRequest(capability="embed-tiny", query=QUERY, documents=["x"]), metadata=md
        )
    assert "cannot answer rerank requests" in (caught.value.details() or "")

    malformed = [
        (inf.RerankRequest(capability="rerank-tiny", query="", documents=DOCUMENTS), "EMPTY_INPUT"),
        (
            inf.RerankRequest(capability="rerank-tiny", query=QUERY, documents=[]),
            "INVALID_ARGUMENT",
        ),
    ]
    for request, reason in malformed:
        assert await _code_and_reason(rerank(request, metadata=md)) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            reason,
        )
    too_many = inf.RerankRequest(
        capability="rerank-tiny", query=QUERY, documents=["x"] * (MAX_INPUTS + 1)
    )
    assert await _code_and_reason(rerank(too_many, metadata=md)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAYLOAD",
    )
    too_long = inf.RerankRequest(capability="rerank-tiny", query=QUERY, documents=["x" * 100_001])
    assert await _code_and_reason(rerank(too_long, metadata=md)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAYLOAD",
    )
    assert await _code_and_reason(
        rerank(inf.RerankRequest(query=QUERY, documents=DOCUMENTS), metadata=md)
    ) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    assert await _code_and_reason(
        rerank(inf.RerankRequest(capability="nope", query=QUERY, documents=DOCUMENTS), metadata=md)
    ) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")

    # Refusing the wrong kind crashed nothing: both deployments still serve their own kind.
    ranked = await rerank(
        inf.RerankRequest(capability="rerank-tiny", query=QUERY, documents=DOCUMENTS), metadata=md
    )
    assert sorted(result.index for result in ranked.results) == list(range(len(DOCUMENTS)))
    vectors = await embed(inf.EmbedRequest(capability="embed-tiny", inputs=["hello"]), metadata=md)
    assert vectors.dim == 32


async def test_model_host_reranks_like_cross_encoder_predict_and_refuses_embeds(
    tiny_cross_encoder_dir: Path,
) -> None:
    host = await forked_host(
        HostLaunchSpec(
            deployment_id="dep-rerank",
            model_directory=tiny_cross_encoder_dir,
            adapter=common_pb2.AdapterSettings(adapter=CROSS_ENCODER, device="cpu"),
            python_executable=sys.executable,
            load_timeout_s=90,
        )
    )
    try:
        assert host.ready.dim == 0
        result = await host.rerank(QUERY, DOCUMENTS, trace_context={}, timeout_s=30)
        np.testing.assert_allclose(
            list(result.scores),
            _direct_scores(tiny_cross_encoder_dir, QUERY, DOCUMENTS),
            rtol=0,
            atol=1e-5,
        )
        with pytest.raises(GantryError) as caught:
            await host.embed(["hello world"], trace_context={}, timeout_s=30)
        assert caught.value.reason == "INVALID_PAYLOAD"
        assert "dep-rerank" in caught.value.message
        assert CROSS_ENCODER in caught.value.message
        assert host.alive
    finally:
        evidence = await host.stop()
    assert evidence.process_exited
    assert evidence.exit_code == 0

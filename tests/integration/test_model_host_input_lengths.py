"""The model host's token-limit check for real: a child process, the tiny models' own tokenizers.

Without truncate an input past the limit is INPUT_TOO_LONG (class REQUEST) naming its index, its
tokens and the limit, and its batch-mates are served; with truncate the answer is the library's own
truncating encode or predict.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

from gantry.common.errors import FailureClass, GantryError
from gantry.v1 import common_pb2, worker_gateway_pb2
from gantry.worker.model_host.input_lengths import first_overlong
from gantry.worker.model_host.process import HostLaunchSpec
from gantry.worker.model_host.serving import TEST_HOOK_SLOW_INPUT
from tests.integration.harness import forked_host

OVERLONG = "hello world " * 100  # 202 tokens alone; the tiny models take 128
QUERY = "quick brown fox"


def _spec(model_directory: Path, adapter: str, deployment_id: str) -> HostLaunchSpec:
    return HostLaunchSpec(
        deployment_id=deployment_id,
        model_directory=model_directory,
        adapter=common_pb2.AdapterSettings(adapter=adapter, device="cpu"),
        python_executable=sys.executable,
        test_hooks=True,
        load_timeout_s=90,
    )


def _vectors(result: worker_gateway_pb2.EmbedResult) -> np.ndarray:
    return np.frombuffer(result.float32_le, dtype="<f4").reshape(result.count, result.dim)


def test_the_first_input_past_the_limit_is_named_and_no_limit_refuses_nothing() -> None:
    error = first_overlong([5, 129, 300], 128, field="inputs")
    assert error is not None and error.reason == "INPUT_TOO_LONG"
    assert error.code.name == "INVALID_ARGUMENT" and error.failure_class is FailureClass.REQUEST
    assert error.metadata == {
        "field": "inputs[1]",
        "input_index": "1",
        "tokens": "129",
        "limit": "128",
    }
    assert "inputs[1] is 129 tokens long; the model takes at most 128" in error.message
    assert first_overlong([128, 128], 128, field="inputs") is None
    assert first_overlong([10_000], 0, field="inputs") is None


async def test_an_overlong_embed_input_is_refused_alone_and_truncate_cuts_it(
    tiny_model_dir: Path,
) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(tiny_model_dir), device="cpu", local_files_only=True)
    host = await forked_host(_spec(tiny_model_dir, "sentence_transformers", "dep-lengths"))
    try:
        # The slow request holds the forward pass, so the three behind it queue and are
        # collected into one batch: the overlong one must fail alone.
        slow = asyncio.create_task(
            host.embed([TEST_HOOK_SLOW_INPUT], trace_context={}, timeout_s=30)
        )
        fine, overlong, also_fine = await asyncio.gather(
            host.embed(["hello world"], trace_context={}, timeout_s=30),
            host.embed(["red green blue", OVERLONG], trace_context={}, timeout_s=30),
            host.embed(["the lazy dog"], trace_context={}, timeout_s=30),
            return_exceptions=True,
        )
        await slow
        assert isinstance(overlong, GantryError) and overlong.reason == "INPUT_TOO_LONG"
        assert overlong.metadata["input_index"] == "1"
        assert (overlong.metadata["tokens"], overlong.metadata["limit"]) == ("202", "128")
        for result, text in ((fine, "hello world"), (also_fine, "the lazy dog")):
            assert isinstance(result, worker_gateway_pb2.EmbedResult)
            np.testing.assert_allclose(
                _vectors(result), reference.encode([text]), rtol=1e-5, atol=1e-6
            )

        cut = await host.embed([OVERLONG], trace_context={}, timeout_s=30, truncate=True)
        np.testing.assert_allclose(
            _vectors(cut), reference.encode([OVERLONG]), rtol=1e-5, atol=1e-6
        )
        # Exactly at the limit is served: 126 words and [CLS], [SEP].
        at_limit = " ".join(["hello"] * 126)
        served = await host.embed([at_limit], trace_context={}, timeout_s=30)
        assert served.count == 1
        with pytest.raises(GantryError) as caught:
            await host.embed([at_limit + " world"], trace_context={}, timeout_s=30)
        assert caught.value.metadata["tokens"] == "129"
    finally:
        await host.stop()


async def test_an_overlong_rerank_pair_is_refused_and_truncate_scores_it_as_predict_does(
    tiny_cross_encoder_dir: Path,
) -> None:
    from sentence_transformers import CrossEncoder

    reference = CrossEncoder(str(tiny_cross_encoder_dir), device="cpu", local_files_only=True)
    host = await forked_host(
        _spec(tiny_cross_encoder_dir, "sentence_transformers_cross_encoder", "dep-rerank-lengths")
    )
    documents = ["the lazy dog", OVERLONG]
    try:
        with pytest.raises(GantryError) as caught:
            await host.rerank(QUERY, documents, trace_context={}, timeout_s=30)
        assert caught.value.reason == "INPUT_TOO_LONG"
        # [CLS] query [SEP] document [SEP]: 3 + 3 + 200.
        assert caught.value.metadata == {
            "field": "documents[1]",
            "input_index": "1",
            "tokens": "206",
            "limit": "128",
        }
        scored = await host.rerank(QUERY, documents, trace_context={}, timeout_s=30, truncate=True)
        expected = reference.predict([(QUERY, document) for document in documents])
        np.testing.assert_allclose(list(scored.scores), expected, rtol=1e-5, atol=1e-6)
    finally:
        await host.stop()

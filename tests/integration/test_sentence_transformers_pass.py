"""The sentence-transformers adapters' own pass (adapters/sentence_transformers_model.one_pass)
returns what the library returns for the same inputs, in their order, also past one batch: the
embedding adapter's rows are `SentenceTransformer.encode`'s (with the default prompt,
truncate_dim and normalisation), the cross-encoder's scores `CrossEncoder.predict`'s."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gantry.v1 import common_pb2
from gantry.worker.model_host.adapters.cross_encoder import SentenceTransformersCrossEncoder
from gantry.worker.model_host.adapters.sentence_transformers_embedding import (
    SentenceTransformersEmbedding,
)
from tests.fixtures.tiny_model import build_tiny_cross_encoder, build_tiny_sentence_transformer

# Texts of different lengths, so a batch pads, and encode() sorts them by length and back.
TEXTS = [
    "a",
    "model resident on a node",
    "the fair queue admits the call and the worker runs it on its host",
    "gantry",
    "short text",
    "placement charges what a residency's envelope holds",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_sentence_transformer(tmp_path_factory.mktemp("tiny-st") / "model")


def _loaded(model_dir: Path, **settings: object) -> SentenceTransformersEmbedding:
    adapter = SentenceTransformersEmbedding()
    adapter.load(model_dir, common_pb2.AdapterSettings(device="cpu", **settings))  # type: ignore[arg-type]
    return adapter


def _encoded(
    adapter: SentenceTransformersEmbedding, texts: list[str], **options: object
) -> np.ndarray:
    model = adapter._require_loaded()
    return np.asarray(
        model.encode(texts, convert_to_numpy=True, show_progress_bar=False, **options),
        dtype="<f4",
    )


@pytest.mark.parametrize("texts", [TEXTS[:1], TEXTS, TEXTS * 7], ids=["one", "six", "42"])
def test_the_pass_returns_encode_s_rows(model_dir: Path, texts: list[str]) -> None:
    adapter = _loaded(model_dir, max_batch_size=16)  # 42 texts: three passes
    vectors = adapter.embed(texts)
    assert vectors.dtype == np.dtype("<f4") and vectors.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(vectors, _encoded(adapter, texts, batch_size=16), rtol=0, atol=1e-6)


def test_normalised_rows_are_encode_s_normalised_rows(model_dir: Path) -> None:
    adapter = _loaded(model_dir, normalize=True)
    vectors = adapter.embed(TEXTS)
    expected = _encoded(adapter, TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(vectors, expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_the_default_prompt_and_truncate_dim_apply_as_encode_applies_them(
    model_dir: Path,
) -> None:
    adapter = _loaded(model_dir)
    plain = adapter.embed(TEXTS)
    model = adapter._require_loaded()
    model.prompts = {"query": "query: "}
    model.default_prompt_name = "query"
    model.truncate_dim = 8
    vectors = adapter.embed(TEXTS)
    assert vectors.shape == (len(TEXTS), 8)
    np.testing.assert_allclose(vectors, _encoded(adapter, TEXTS), rtol=0, atol=1e-6)
    assert not np.allclose(vectors, plain[:, :8], atol=1e-4)  # the prompt changed the rows
    # The prompt counts in the tokens each input holds, as the pass sees them.
    assert adapter.embed_token_counts(["a"])[0] > adapter._token_counts(["a"])[0]


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-ce") / "model")


@pytest.mark.parametrize("documents", [TEXTS[:1], TEXTS, TEXTS * 7], ids=["one", "six", "42"])
def test_the_cross_encoder_s_scores_are_predict_s(
    cross_encoder_dir: Path, documents: list[str]
) -> None:
    adapter = SentenceTransformersCrossEncoder()
    adapter.load(cross_encoder_dir, common_pb2.AdapterSettings(device="cpu", max_batch_size=16))
    query = "which model is resident"
    scores = adapter.rerank(query, documents)
    expected = adapter._require_loaded().predict(
        [(query, document) for document in documents],
        batch_size=16,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    assert scores.dtype == np.dtype("<f4") and scores.shape == (len(documents),)
    np.testing.assert_allclose(scores, np.asarray(expected, dtype="<f4"), rtol=0, atol=1e-6)
    assert ((scores > 0) & (scores < 1)).all()  # through the model's sigmoid, as predict() does

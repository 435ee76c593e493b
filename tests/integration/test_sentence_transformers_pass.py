"""The sentence-transformers adapters' own pass (adapters/sentence_transformers_model.one_pass)
returns what the library returns for the same inputs, in their order, also past one batch: the
embedding adapter's rows are `SentenceTransformer.encode`'s (with the default prompt,
truncate_dim and normalisation), the cross-encoder's scores `CrossEncoder.predict`'s.

On the CPU both adapters serve their transformer traced (adapters/traced_encoder.py), so the rows
and scores above are the traced pass's against the library's eager encode() and predict(); where
the trace is not checked equal, or cannot be made, the eager pass serves and the load's evidence
says why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gantry.v1 import common_pb2
from gantry.worker.model_host.adapters import traced_encoder
from gantry.worker.model_host.adapters.base import HEALTH_PROBE_TEXT
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
    return _loaded_with_evidence(model_dir, **settings)[0]


def _loaded_with_evidence(
    model_dir: Path, **settings: object
) -> tuple[SentenceTransformersEmbedding, str]:
    """The adapter, loaded, and its load evidence's line on the pass it serves."""
    adapter = SentenceTransformersEmbedding()
    facts = adapter.load(model_dir, common_pb2.AdapterSettings(device="cpu", **settings))  # type: ignore[arg-type]
    return adapter, facts.versions[traced_encoder.FORWARD_PASS_KEY]


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


def test_on_the_cpu_the_traced_pass_serves_and_the_evidence_says_so(model_dir: Path) -> None:
    adapter, evidence = _loaded_with_evidence(model_dir)
    assert evidence.startswith("traced: torch.jit trace, freeze, optimize_for_inference"), evidence
    assert evidence.endswith("on 3 inputs alone and 2 as one padded batch")
    assert adapter._forward is not adapter._require_loaded()  # the rows above are the traced's
    # Inputs of shapes it was not traced with, one by one and padded together: encode()'s rows.
    for texts in ([TEXTS[0]], [TEXTS[2]], TEXTS, [" ".join(TEXTS * 3)]):
        np.testing.assert_allclose(adapter.embed(texts), _encoded(adapter, texts), atol=1e-6)


def test_a_traced_pass_that_differs_from_the_eager_one_is_not_served(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Any difference at all, float rounding included, counts as past the bound.
    monkeypatch.setattr(traced_encoder, "TOLERANCE", -1.0)
    adapter, evidence = _loaded_with_evidence(model_dir)
    assert evidence.startswith("eager: the traced pass differed from it by "), evidence
    assert adapter._forward is adapter._require_loaded()
    np.testing.assert_allclose(adapter.embed(TEXTS), _encoded(adapter, TEXTS), rtol=0, atol=0)


def test_a_model_tracing_cannot_record_is_served_eagerly_with_the_reason(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("this model's forward cannot be recorded")

    monkeypatch.setattr(torch.jit, "trace", refuse)
    adapter, evidence = _loaded_with_evidence(model_dir)
    assert evidence == (
        "eager: tracing failed (RuntimeError: this model's forward cannot be recorded)"
    )
    np.testing.assert_allclose(adapter.embed(TEXTS), _encoded(adapter, TEXTS), rtol=0, atol=0)


def test_weights_other_than_float32_are_served_eagerly_without_a_trace(model_dir: Path) -> None:
    import torch

    model = _loaded(model_dir)._require_loaded().to(torch.bfloat16)
    choice = traced_encoder.choose_forward(
        model, alone=[HEALTH_PROBE_TEXT], together=[], output="sentence_embedding"
    )
    assert choice.forward is model
    assert choice.evidence == "eager: weights in ['torch.bfloat16'], not float32 alone"


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


def test_the_cross_encoder_serves_its_traced_pass_and_says_so(cross_encoder_dir: Path) -> None:
    adapter = SentenceTransformersCrossEncoder()
    facts = adapter.load(cross_encoder_dir, common_pb2.AdapterSettings(device="cpu"))
    evidence = facts.versions[traced_encoder.FORWARD_PASS_KEY]
    assert evidence.startswith("traced: ") and evidence.endswith(
        "on 3 inputs alone and 2 as one padded batch"
    ), evidence
    model = adapter._require_loaded()
    assert adapter._forward is not model
    query = "which model is resident"
    for documents in ([TEXTS[0]], TEXTS, [" ".join(TEXTS * 3)]):
        expected = model.predict(
            [(query, document) for document in documents], show_progress_bar=False
        )
        np.testing.assert_allclose(
            adapter.rerank(query, documents), np.asarray(expected, dtype="<f4"), atol=1e-6
        )


def test_two_traced_passes_at_once_on_lanes_return_encode_s_rows(model_dir: Path) -> None:
    """Two batches side by side on a host's lanes (model_host/pass_lanes.py), each on its own
    thread with one intra-op thread, while the serving loop counts tokens (untruncated) beside
    them: every batch's rows are still encode()'s, long inputs truncated as encode() cuts them."""
    import torch

    from gantry.worker.model_host.pass_lanes import LANES, PassLanes

    adapter, evidence = _loaded_with_evidence(model_dir)
    assert evidence.startswith("traced:"), evidence
    long_text = " ".join(TEXTS * 20)  # past the tiny model's token limit: the pass truncates it
    batches = [[*TEXTS[i % len(TEXTS) :], long_text, f"batch {i}"] for i in range(12)]
    expected = [_encoded(adapter, batch) for batch in batches]
    counts = adapter.embed_token_counts([long_text])
    rows: dict[int, np.ndarray] = {}
    threads_seen: list[int] = []
    # A lane's count also becomes torch's default for threads started later in this process:
    # put it back for the tests after this one.
    before = torch.get_num_threads()
    lanes = PassLanes(threads=2, set_threads=torch.set_num_threads)

    def run(index: int) -> None:
        threads_seen.append(torch.get_num_threads())
        rows[index] = adapter.embed(batches[index])

    try:
        for index in range(len(batches)):
            lanes.submit(lambda index=index: run(index))  # type: ignore[misc]
            assert adapter.embed_token_counts([long_text]) == counts
        lanes.wait_idle()
    finally:
        lanes.close()
        torch.set_num_threads(before)
    assert sorted(rows) == list(range(len(batches)))
    for index, batch_rows in rows.items():
        np.testing.assert_allclose(batch_rows, expected[index], rtol=0, atol=1e-6)
    assert set(threads_seen) == {1} and LANES == 2  # each lane's share of the host's 2 threads

"""The sentence-transformers cross-encoder adapter: a query and documents in, one score per
document, in a model host. It reranks only with exactly one label (one score per pair)."""

from __future__ import annotations

from gantry.worker.runtime_adapters.layouts import DetailRule, LayoutMatch
from gantry.worker.runtime_adapters.model_host_runtime import ModelHostRuntime
from gantry.worker.runtime_adapters.sentence_transformers import PACKAGES


class SentenceTransformersCrossEncoder(ModelHostRuntime):
    name = "sentence_transformers_cross_encoder"
    task = "reranking"
    modalities = ("text",)
    # The facts script lists it only when sentence_transformers also exports CrossEncoder.
    packages = PACKAGES
    layout = LayoutMatch(
        runs="reranking models",
        inspector="sentence_transformers",
        task=task,
        names_model_type=False,
        details=(
            DetailRule(
                key="num_labels",
                accepted=("1",),
                refusal="reranking needs exactly one score per pair; num_labels={value}",
            ),
        ),
    )

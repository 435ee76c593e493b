"""The sentence-transformers embedding adapter: text in, one vector per input, in a model host."""

from __future__ import annotations

from gantry.worker.runtime_adapters.layouts import LayoutMatch
from gantry.worker.runtime_adapters.model_host_runtime import ModelHostRuntime

# Distribution names as the facts script reports their versions; it lists this adapter only
# when all of them are importable.
PACKAGES = ("sentence-transformers", "torch", "transformers")


class SentenceTransformersEmbedding(ModelHostRuntime):
    name = "sentence_transformers"
    task = "embedding"
    modalities = ("text",)
    packages = PACKAGES
    layout = LayoutMatch(
        runs="embedding models",
        inspector="sentence_transformers",
        task=task,
        names_model_type=False,
    )

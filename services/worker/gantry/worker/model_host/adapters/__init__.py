"""The model host's adapters by name: one module per adapter, chosen here and nowhere else.

An unknown name is RUNTIME_INCOMPATIBLE (class CONFIG), never a fallback to another adapter. The
empty name is the embedding adapter: deployments created before adapters were named carry none.
Importing this package imports no ML library (see `base`).
"""

from __future__ import annotations

from collections.abc import Mapping

from gantry.common.errors import GantryError
from gantry.worker.model_host.adapters.base import ForwardCheck, ModelAdapter, RuntimeFacts
from gantry.worker.model_host.adapters.causal_lm import TransformersCausalLM
from gantry.worker.model_host.adapters.cross_encoder import SentenceTransformersCrossEncoder
from gantry.worker.model_host.adapters.sentence_transformers_embedding import (
    SentenceTransformersEmbedding,
)
from gantry.worker.model_host.adapters.siglip2 import TransformersSiglip2
from gantry.worker.model_host.adapters.trocr import TransformersTrOCR
from gantry.worker.model_host.adapters.whisper import TransformersWhisper

ADAPTERS: Mapping[str, type[ModelAdapter]] = {
    adapter.name: adapter
    for adapter in (
        SentenceTransformersEmbedding,
        SentenceTransformersCrossEncoder,
        TransformersWhisper,
        TransformersTrOCR,
        TransformersSiglip2,
        TransformersCausalLM,
    )
}
DEFAULT_ADAPTER = SentenceTransformersEmbedding.name


def adapter_for(name: str) -> ModelAdapter:
    """A fresh, unloaded adapter for `name`; RUNTIME_INCOMPATIBLE when there is none."""
    adapter_class = ADAPTERS.get(name or DEFAULT_ADAPTER)
    if adapter_class is None:
        raise GantryError(
            "RUNTIME_INCOMPATIBLE",
            f"adapter {name!r} is not supported by this model host; supported: "
            + ", ".join(sorted(ADAPTERS)),
            adapter=name,
        )
    return adapter_class()


__all__ = [
    "ADAPTERS",
    "DEFAULT_ADAPTER",
    "ForwardCheck",
    "ModelAdapter",
    "RuntimeFacts",
    "adapter_for",
]

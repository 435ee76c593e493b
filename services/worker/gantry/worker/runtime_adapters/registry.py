"""The worker's runtime adapters by name: chosen here and nowhere else.

An unknown name is RUNTIME_INCOMPATIBLE (class CONFIG), never a fallback to another adapter. The
empty name is the embedding adapter: deployments created before adapters were named carry none.
The model host keeps its own registry of the same names (`model_host/adapters`) for the child.
PROBE, INSPECT and serving (LOAD, HEALTH, UNLOAD) all choose their adapter here.
"""

from __future__ import annotations

from collections.abc import Mapping

from gantry.common.errors import GantryError
from gantry.worker.runtime_adapters.base import RuntimeAdapter
from gantry.worker.runtime_adapters.causal_lm import TransformersCausalLM
from gantry.worker.runtime_adapters.cross_encoder import SentenceTransformersCrossEncoder
from gantry.worker.runtime_adapters.llama_cpp_server import LlamaCppServer
from gantry.worker.runtime_adapters.model_host_runtime import ModelHostRuntime, ProbeHostFactory
from gantry.worker.runtime_adapters.sentence_transformers import SentenceTransformersEmbedding
from gantry.worker.runtime_adapters.siglip2 import TransformersSiglip2
from gantry.worker.runtime_adapters.trocr import TransformersTrOCR
from gantry.worker.runtime_adapters.vllm_server import VllmServer
from gantry.worker.runtime_adapters.whisper import TransformersWhisper

_ADAPTERS: tuple[RuntimeAdapter, ...] = (
    SentenceTransformersEmbedding(),
    SentenceTransformersCrossEncoder(),
    TransformersWhisper(),
    TransformersTrOCR(),
    TransformersSiglip2(),
    TransformersCausalLM(),
    # Managed servers: a server process the worker runs, not a model host (`managed_server`).
    LlamaCppServer(),
    VllmServer(),
)
RUNTIME_ADAPTERS: Mapping[str, RuntimeAdapter] = {adapter.name: adapter for adapter in _ADAPTERS}
DEFAULT_ADAPTER = SentenceTransformersEmbedding.name


def adapter_name(name: str) -> str:
    """An empty adapter name means the default one (as the control plane fills it in)."""
    return name or DEFAULT_ADAPTER


def registered_adapters() -> tuple[RuntimeAdapter, ...]:
    """Every adapter this worker runs, in registration order."""
    return _ADAPTERS


def runtime_adapter_for(
    name: str, *, host_factory: ProbeHostFactory | None = None
) -> RuntimeAdapter:
    """The adapter `name` (or the default for ""); RUNTIME_INCOMPATIBLE when there is none.
    `host_factory` replaces how a model-host adapter starts its children (the worker's warm
    pool, a test's wrapper); a managed server kind always starts its own server."""
    resolved = adapter_name(name)
    adapter = RUNTIME_ADAPTERS.get(resolved)
    if adapter is None:
        raise GantryError(
            "RUNTIME_INCOMPATIBLE",
            f"adapter {resolved!r} is not supported; supported: "
            + ", ".join(sorted(RUNTIME_ADAPTERS)),
            adapter=resolved,
        )
    if host_factory is not None and isinstance(adapter, ModelHostRuntime):
        return adapter.launched_by(host_factory)
    return adapter

"""The adapters a worker can execute in this version and the input each takes. Pure.

The control plane's own table, so that what a deployment needs of a node follows from its
adapter alone: a deployment of an image adapter needs a node whose environments take images
(`modality:image`), whatever else the node can run. Workers declare the same per environment
(their runtime adapters' modalities, in the Hello); the two meet in the placement label gate.
SigLIP2 embeds texts too, but only beside images: the modality a node must offer is image.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

DEFAULT_ADAPTER = "sentence_transformers"  # what an empty adapter name means
WHISPER_ADAPTER = "transformers_whisper"
TROCR_ADAPTER = "transformers_trocr"
SIGLIP2_ADAPTER = "transformers_siglip2"
CAUSAL_LM_ADAPTER = "transformers_causal_lm"  # text generation: Generate, GenerateStream
# Managed OpenAI-compatible servers the worker starts and supervises (text generation too): a GGUF
# through llama.cpp's server; vLLM's is known to the worker but runs only where vLLM installs.
LLAMA_CPP_SERVER_ADAPTER = "llama_cpp_server"
VLLM_SERVER_ADAPTER = "vllm_server"

TEXT = "text"
AUDIO = "audio"
IMAGE = "image"

ADAPTER_MODALITIES: Mapping[str, str] = MappingProxyType(
    {
        DEFAULT_ADAPTER: TEXT,
        "sentence_transformers_cross_encoder": TEXT,
        WHISPER_ADAPTER: AUDIO,
        TROCR_ADAPTER: IMAGE,
        SIGLIP2_ADAPTER: IMAGE,
        CAUSAL_LM_ADAPTER: TEXT,
        LLAMA_CPP_SERVER_ADAPTER: TEXT,
        VLLM_SERVER_ADAPTER: TEXT,
    }
)
IMAGE_ADAPTERS = frozenset(name for name, m in ADAPTER_MODALITIES.items() if m == IMAGE)
# The adapters that answer Generate (and so read max_new_tokens), in process or through a server.
GENERATION_ADAPTERS = frozenset({CAUSAL_LM_ADAPTER, LLAMA_CPP_SERVER_ADAPTER, VLLM_SERVER_ADAPTER})


def modality_of(adapter: str) -> str | None:
    """The input `adapter` takes ("" is the default adapter); None for a name not in the table."""
    return ADAPTER_MODALITIES.get(adapter or DEFAULT_ADAPTER)

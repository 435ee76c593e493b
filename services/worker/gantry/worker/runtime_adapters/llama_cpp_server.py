"""The llama.cpp server adapter: a GGUF model served by llama-cpp-python's OpenAI-compatible
server (`python -m llama_cpp.server`), which the worker runs as a managed server process."""

from __future__ import annotations

from gantry.worker.managed_server.kinds import LLAMA_CPP_SERVER
from gantry.worker.runtime_adapters.managed_server_runtime import (
    ManagedServerRuntime,
    served_generation,
)


class LlamaCppServer(ManagedServerRuntime):
    name = LLAMA_CPP_SERVER
    task = "text_generation"
    modalities = ("text",)
    # The facts script lists it where the environment's python finds `llama_cpp.server` and
    # the server extra's packages (found, not imported).
    packages = ("llama-cpp-python",)
    layout = served_generation("gguf")

"""The vLLM server adapter: a transformers text-generation layout served by `vllm serve`, which
the worker runs as a managed server process. Built and checked statically here: vLLM does not
install on this CPU-only machine, so no environment of it lists this adapter."""

from __future__ import annotations

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.managed_server.kinds import VLLM_SERVER
from gantry.worker.runtime_adapters.base import Support
from gantry.worker.runtime_adapters.managed_server_runtime import (
    ManagedServerRuntime,
    served_generation,
)


class VllmServer(ManagedServerRuntime):
    name = VLLM_SERVER
    task = "text_generation"
    modalities = ("text",)
    # The facts script lists it where a `vllm` executable sits beside the environment's python.
    packages = ("vllm",)
    # What it would serve; `inspect_support` below declines to offer it all the same.
    layout = served_generation("transformers")

    def inspect_support(self, inspection: wg.Inspection) -> Support:
        # Not offered by inspection: no environment here can run it, so offering it would add
        # an "unavailable" finding to every causal LM's inspection. A profile may still name it;
        # its load then needs an environment whose facts list it.
        return Support(
            adapter=self.name,
            supported=False,
            reason="vllm_server is not offered by static inspection; a runtime profile names it",
        )

"""The transformers causal-LM adapter: a prompt or a chat in, generated text out, in a model host.
It runs what static inspection read as a transformers text-generation layout (a `*ForCausalLM`
or `*LMHeadModel` architecture: llama, gpt2, qwen2, mistral, ...)."""

from __future__ import annotations

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.runtime_adapters.base import Support
from gantry.worker.runtime_adapters.model_host_runtime import ModelHostRuntime

# The model host loads AutoModelForCausalLM and AutoTokenizer from transformers itself. The facts
# script lists this adapter wherever torch and transformers are installed (no import).
PACKAGES = ("torch", "transformers")
TASK = "text-generation"  # as inspection names it (`inspection.transformers`)


class TransformersCausalLM(ModelHostRuntime):
    name = "transformers_causal_lm"
    task = "text_generation"
    modalities = ("text",)
    packages = PACKAGES

    def inspect_support(self, inspection: wg.Inspection) -> Support:
        if inspection.inspector != "transformers":
            return Support(
                adapter=self.name,
                supported=False,
                reason=f"runs transformers layouts, not {inspection.inspector}",
            )
        if inspection.task != TASK:
            return Support(
                adapter=self.name,
                supported=False,
                reason=(
                    f"runs causal language models (text generation), not "
                    f"{inspection.model_type or '?'} ({inspection.task or 'an unknown task'})"
                ),
            )
        return Support(adapter=self.name, supported=True)

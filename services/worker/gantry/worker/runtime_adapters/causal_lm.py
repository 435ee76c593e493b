"""The transformers causal-LM adapter: a prompt or a chat in, generated text out, in a model host.
It runs what static inspection read as a transformers text-generation layout (a `*ForCausalLM`
or `*LMHeadModel` architecture: llama, gpt2, qwen2, mistral, ...)."""

from __future__ import annotations

from gantry.worker.runtime_adapters.layouts import LayoutMatch
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
    # Any model type of the task: the architecture, not the model type, makes it a causal LM.
    layout = LayoutMatch(
        inspector="transformers", task=TASK, runs="causal language models (text generation)"
    )

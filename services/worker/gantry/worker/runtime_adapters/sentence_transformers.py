"""The sentence-transformers embedding adapter: text in, one vector per input, in a model host."""

from __future__ import annotations

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.runtime_adapters.base import Support
from gantry.worker.runtime_adapters.model_host_runtime import ModelHostRuntime

# Distribution names as the facts script reports their versions; it lists this adapter only
# when all of them are importable.
PACKAGES = ("sentence-transformers", "torch", "transformers")


class SentenceTransformersEmbedding(ModelHostRuntime):
    name = "sentence_transformers"
    task = "embedding"
    modalities = ("text",)
    packages = PACKAGES

    def inspect_support(self, inspection: wg.Inspection) -> Support:
        if inspection.inspector != "sentence_transformers":
            return Support(
                adapter=self.name,
                supported=False,
                reason=f"runs sentence-transformers layouts, not {inspection.inspector}",
            )
        if inspection.task != self.task:
            return Support(
                adapter=self.name,
                supported=False,
                reason=f"runs embedding models, not {inspection.task or 'an unknown task'}",
            )
        return Support(adapter=self.name, supported=True)

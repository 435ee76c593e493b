"""The sentence-transformers cross-encoder adapter: a query and documents in, one score per
document, in a model host. It reranks only with exactly one label (one score per pair)."""

from __future__ import annotations

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.runtime_adapters.base import Support
from gantry.worker.runtime_adapters.model_host_runtime import ModelHostRuntime
from gantry.worker.runtime_adapters.sentence_transformers import PACKAGES


class SentenceTransformersCrossEncoder(ModelHostRuntime):
    name = "sentence_transformers_cross_encoder"
    task = "reranking"
    modalities = ("text",)
    # The facts script lists it only when sentence_transformers also exports CrossEncoder.
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
                reason=f"runs reranking models, not {inspection.task or 'an unknown task'}",
            )
        labels = inspection.details.get("num_labels", "")
        if labels != "1":
            return Support(
                adapter=self.name,
                supported=False,
                reason=f"reranking needs exactly one score per pair; num_labels={labels or '?'}",
            )
        return Support(adapter=self.name, supported=True)

"""The transformers SigLIP2 adapter: images and texts embedded in one space, and images
classified zero-shot against the labels a request gives, in a model host. It runs what static
inspection read as a SigLIP2 dual encoder (`Siglip2Model`)."""

from __future__ import annotations

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.runtime_adapters.base import Support
from gantry.worker.runtime_adapters.model_host_runtime import ModelHostRuntime

# No sentence-transformers: the model host loads Siglip2Model and Siglip2Processor from
# transformers itself, whose image processors need torchvision, and decodes images with Pillow.
# The facts script lists this adapter only when all four are installed and transformers ships
# its siglip2 model package (no import: see environment_facts).
PACKAGES = ("torch", "transformers", "torchvision", "Pillow")
MODEL_TYPE = "siglip2"
TASK = "zero-shot-image-classification"  # as inspection names it (`inspection.siglip2`)


class TransformersSiglip2(ModelHostRuntime):
    name = "transformers_siglip2"
    task = "image_embedding"
    modalities = ("image",)
    packages = PACKAGES

    def inspect_support(self, inspection: wg.Inspection) -> Support:
        if inspection.inspector != "transformers":
            return Support(
                adapter=self.name,
                supported=False,
                reason=f"runs transformers layouts, not {inspection.inspector}",
            )
        if inspection.model_type != MODEL_TYPE or inspection.task != TASK:
            return Support(
                adapter=self.name,
                supported=False,
                reason=(
                    f"runs SigLIP2 image and text embeddings, not {inspection.model_type or '?'} "
                    f"({inspection.task or 'an unknown task'})"
                ),
            )
        return Support(adapter=self.name, supported=True)

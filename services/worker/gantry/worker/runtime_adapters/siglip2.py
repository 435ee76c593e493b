"""The transformers SigLIP2 adapter: images and texts embedded in one space, and images
classified zero-shot against the labels a request gives, in a model host. It runs what static
inspection read as a SigLIP2 dual encoder (`Siglip2Model`)."""

from __future__ import annotations

from gantry.worker.runtime_adapters.layouts import LayoutMatch
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
    layout = LayoutMatch(
        runs="SigLIP2 image and text embeddings",
        inspector="transformers",
        task=TASK,
        model_type=MODEL_TYPE,
    )

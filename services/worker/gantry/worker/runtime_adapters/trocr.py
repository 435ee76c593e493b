"""The transformers TrOCR adapter: an image of a line of text in, the text out, in a model host.
It runs what static inspection read as a TrOCR layout: a transformers vision-encoder-decoder
whose decoder is `trocr` and whose encoder is an image transformer (ViT, DeiT)."""

from __future__ import annotations

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.runtime_adapters.base import Support
from gantry.worker.runtime_adapters.model_host_runtime import ModelHostRuntime

# No sentence-transformers: the model host loads VisionEncoderDecoderModel and TrOCRProcessor
# from transformers itself, whose image processors need torchvision, and decodes images with
# Pillow. The facts script lists this adapter only when all four are installed and transformers
# ships its trocr and vision_encoder_decoder model packages (no import: see environment_facts).
PACKAGES = ("torch", "transformers", "torchvision", "Pillow")
MODEL_TYPE = "vision-encoder-decoder"
TASK = "image-to-text"  # as inspection names it (`inspection.trocr`)
DECODER_TYPE = "trocr"
# The image transformers TrOCR checkpoints are built on; their processors resize to a square.
ENCODER_TYPES = ("vit", "deit")


class TransformersTrOCR(ModelHostRuntime):
    name = "transformers_trocr"
    task = "text_recognition"
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
                    f"runs TrOCR text recognition, not {inspection.model_type or '?'} "
                    f"({inspection.task or 'an unknown task'})"
                ),
            )
        decoder = inspection.details.get("decoder_model_type", "")
        if decoder != DECODER_TYPE:
            return Support(
                adapter=self.name,
                supported=False,
                reason=f"runs a {DECODER_TYPE} decoder, not {decoder or '?'}",
            )
        encoder = inspection.details.get("encoder_model_type", "")
        if encoder not in ENCODER_TYPES:
            return Support(
                adapter=self.name,
                supported=False,
                reason=f"runs a {' or '.join(ENCODER_TYPES)} encoder, not {encoder or '?'}",
            )
        return Support(adapter=self.name, supported=True)

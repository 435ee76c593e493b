"""The transformers TrOCR adapter: an image of a line of text in, the text out, in a model host.
It runs what static inspection read as a TrOCR layout: a transformers vision-encoder-decoder
whose decoder is `trocr` and whose encoder is an image transformer (ViT, DeiT)."""

from __future__ import annotations

from gantry.worker.runtime_adapters.layouts import DetailRule, LayoutMatch
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
    layout = LayoutMatch(
        runs="TrOCR text recognition",
        inspector="transformers",
        task=TASK,
        model_type=MODEL_TYPE,
        details=(
            DetailRule(
                key="decoder_model_type",
                accepted=(DECODER_TYPE,),
                refusal=f"runs a {DECODER_TYPE} decoder, not {{value}}",
            ),
            DetailRule(
                key="encoder_model_type",
                accepted=ENCODER_TYPES,
                refusal=f"runs a {' or '.join(ENCODER_TYPES)} encoder, not {{value}}",
            ),
        ),
    )

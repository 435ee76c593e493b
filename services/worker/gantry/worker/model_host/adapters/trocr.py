"""`transformers_trocr`: text recognition (OCR) with a transformers VisionEncoderDecoderModel.

One line of text per image, as TrOCR reads it: the artifact's image processor (a ViT processor,
through TrOCRProcessor) turns each image into the encoder's pixels, and the decoder generates
greedily (one beam, no sampling: the same image gives the same ids). `max_input_length` bounds
the new tokens when set; otherwise the artifact's generation config does. Images are decoded by
the serving loop (`image_decoding`) and arrive here as RGB; a request's images are generated in
batches of at most `max_batch_size`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gantry.v1 import common_pb2
from gantry.worker.model_host.adapters.base import (
    ForwardCheck,
    ModelAdapter,
    WorstCase,
    check_output,
)
from gantry.worker.model_host.adapters.image_inputs import (
    check_preprocessing,
    rendered_text_line,
)

if TYPE_CHECKING:
    from PIL import Image as PILImage


class TransformersTrOCR(ModelAdapter):
    name = "transformers_trocr"
    task = "ocr"
    serves = frozenset({"recognize_text"})

    def __init__(self) -> None:
        super().__init__()
        self._processor: Any = None
        self._max_new_tokens = 0  # 0: the generation config's bound

    def _load(self, model_directory: Path, settings: common_pb2.AdapterSettings) -> Any:
        # Imported here, after the offline flags, the network guard and the sandbox.
        from transformers import TrOCRProcessor, VisionEncoderDecoderModel

        processor = TrOCRProcessor.from_pretrained(
            str(model_directory),
            local_files_only=self.local_files_only,
            trust_remote_code=self.trust_remote_code,
        )
        check_preprocessing(settings, processor.image_processor, adapter=self.name)
        model: Any = VisionEncoderDecoderModel.from_pretrained(
            str(model_directory),
            local_files_only=self.local_files_only,
            trust_remote_code=self.trust_remote_code,
        )
        self._processor = processor
        self._max_new_tokens = settings.max_input_length
        return model.to(settings.device or "cpu")

    def library_versions(self) -> dict[str, str]:
        import PIL
        import torchvision

        return {"pillow": PIL.__version__, "torchvision": torchvision.__version__}

    # -- requests -------------------------------------------------------------------------------

    def recognize_text(self, images: Sequence[PILImage.Image]) -> list[str]:
        texts: list[str] = []
        for start in range(0, len(images), self.max_batch_inputs):
            generated = self.generate(images[start : start + self.max_batch_inputs])
            texts.extend(
                self._processor.tokenizer.batch_decode(generated, skip_special_tokens=True)
            )
        return texts

    def generate(self, images: Sequence[PILImage.Image]) -> Any:
        """Greedy generation on a batch of RGB images: the ids tensor, one row per image (the
        decoder's start token first, padded after the end token)."""
        import torch

        model = self._require_loaded()
        limits = {"max_new_tokens": self._max_new_tokens} if self._max_new_tokens else {}
        with torch.inference_mode():
            return model.generate(self.pixel_values(images), num_beams=1, do_sample=False, **limits)

    def pixel_values(self, images: Sequence[PILImage.Image]) -> Any:
        """The encoder's input for `images`, as the artifact's image processor makes it."""
        model = self._require_loaded()
        pixels = self._processor(images=list(images), return_tensors="pt").pixel_values
        return pixels.to(model.device, dtype=model.dtype)

    # -- health ---------------------------------------------------------------------------------

    def health_check(self) -> ForwardCheck:
        """A rendered line of text through the encoder (finite, one sequence of hidden states)
        and the decoder (new ids, each in the tokenizer's vocabulary)."""
        import torch

        started = time.monotonic()
        model = self._require_loaded()
        line = rendered_text_line()
        with torch.inference_mode():
            encoded = model.get_encoder()(pixel_values=self.pixel_values([line]))
        hidden = encoded.last_hidden_state.float().cpu().numpy()
        ids = [int(token) for token in self.generate([line])[0].tolist()]
        check = check_output(
            hidden,
            expected_shape=(1, 0, 0),
            seconds=time.monotonic() - started,
            healthy=(
                f"encoder states {tuple(hidden.shape)} finite; {len(ids) - 1} generated ids, "
                "all in the vocabulary"
            ),
        )
        vocabulary = len(self._processor.tokenizer)
        problem = None
        if len(ids) < 2:  # the decoder's start token alone: nothing was generated
            problem = "probe generated no ids"
        elif not all(0 <= token < vocabulary for token in ids):
            problem = f"probe generated ids outside the vocabulary of {vocabulary}"
        if check.ok and problem:
            return check.failed(problem)
        return check

    def worst_case_check(self) -> tuple[ForwardCheck, WorstCase]:
        """A batch of the batch size's images (the processor resizes every image to one size, so
        only their number varies), each decoded to the most new tokens allowed, forced (no early
        end token), so the decoder's cache reaches its longest."""
        import torch

        model = self._require_loaded()
        batch = self.max_batch_inputs
        # Without the profile's bound, the generation config's max_length (the start token in it).
        new_tokens = self._max_new_tokens or max(1, int(model.generation_config.max_length) - 1)
        started = time.monotonic()
        with torch.inference_mode():
            ids = model.generate(
                self.pixel_values([rendered_text_line()] * batch),
                num_beams=1,
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
            )
        generated = int(ids.shape[1]) - 1  # the decoder's start token is not generated
        check = check_output(
            ids.float().cpu().numpy(),
            expected_shape=(batch, 0),
            seconds=time.monotonic() - started,
            healthy=f"{batch} images decoded to {generated} tokens each",
        )
        worst = WorstCase(
            batch_inputs=batch,
            input_tokens=0,
            generated_tokens=generated,
            context_tokens=int(ids.shape[1]),
            detail=f"{batch} images at the processor's size, each decoding {generated} tokens "
            f"(batch size {batch})",
        )
        return check, worst

"""`transformers_siglip2`: image and text embeddings in one space, and zero-shot classification,
with a transformers SigLIP2 model (Siglip2Model and its processor).

Texts are tokenized as SigLIP was trained: padded to the text tower's positions (64 for released
checkpoints; `padding="max_length"`), and a text past the token limit (those positions, or a lower
`max_input_length`) is refused unless the request asks to truncate (`input_lengths`). Images go
through the artifact's own image processor (for SigLIP2 NaFlex: resized, aspect kept, to at most
`max_num_patches` patches), called directly rather than through the processor, whose class-level
defaults (256 patches of 16 pixels) would override what the artifact says. Text and image vectors
are the towers' pooled outputs, L2-normalised when the deployment says `normalize`, as the
sentence-transformers adapter treats it. A classification scores each label on its own, as SigLIP
does: the sigmoid of `logits_per_image` (the model's cosine similarity, scale and bias), so a row
need not sum to 1.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2
from gantry.worker.model_host.adapters.base import (
    ForwardCheck,
    ModelAdapter,
    WorstCase,
    check_output,
    token_counts,
    worst_case_text,
)
from gantry.worker.model_host.adapters.image_inputs import check_preprocessing, gradient

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image as PILImage

MODEL_TYPE = "siglip2"


class TransformersSiglip2(ModelAdapter):
    name = "transformers_siglip2"
    task = "image_embedding"
    serves = frozenset({"embed", "embed_image", "classify_image"})

    def __init__(self) -> None:
        super().__init__()
        self._image_processor: Any = None
        self._tokenizer: Any = None
        self._normalize = False
        self._dim = 0
        self._positions = 0  # what every text is padded to
        self._token_limit = 0  # what a text may hold: the positions, or a lower max_input_length

    def _load(self, model_directory: Path, settings: common_pb2.AdapterSettings) -> Any:
        # Imported here, after the offline flags, the network guard and the sandbox.
        from transformers import AutoModel, AutoProcessor

        processor = AutoProcessor.from_pretrained(
            str(model_directory),
            local_files_only=self.local_files_only,
            trust_remote_code=self.trust_remote_code,
        )
        check_preprocessing(settings, processor.image_processor, adapter=self.name)
        model: Any = AutoModel.from_pretrained(
            str(model_directory),
            local_files_only=self.local_files_only,
            trust_remote_code=self.trust_remote_code,
        )
        config = model.config
        if config.model_type != MODEL_TYPE:
            raise GantryError(
                "RUNTIME_INCOMPATIBLE",
                f"{self.name} runs SigLIP2 models; the artifact is {config.model_type!r}",
                adapter=self.name,
            )
        image_width = int(config.vision_config.hidden_size)
        text_width = int(config.text_config.projection_size or config.text_config.hidden_size)
        if image_width != text_width:
            raise GantryError(
                "RUNTIME_INCOMPATIBLE",
                f"the image tower's vectors are {image_width} wide and the text tower's "
                f"{text_width}: they are not one space",
                adapter=self.name,
            )
        self._positions = int(config.text_config.max_position_embeddings)
        if settings.max_input_length > self._positions:
            raise GantryError(
                "RUNTIME_INCOMPATIBLE",
                f"max_input_length {settings.max_input_length} is past the text tower's "
                f"{self._positions} positions",
                adapter=self.name,
                field="adapter.max_input_length",
                limit=str(self._positions),
            )
        self._token_limit = settings.max_input_length or self._positions
        self._image_processor = processor.image_processor
        self._tokenizer = processor.tokenizer
        self._normalize = settings.normalize
        self._dim = image_width
        return model.to(settings.device or "cpu")

    def library_versions(self) -> dict[str, str]:
        import PIL
        import torchvision

        return {"pillow": PIL.__version__, "torchvision": torchvision.__version__}

    @property
    def dim(self) -> int:
        return self._dim

    # -- text -----------------------------------------------------------------------------------

    @property
    def token_limit(self) -> int:
        return self._token_limit

    def embed_token_counts(self, inputs: Sequence[str]) -> list[int]:
        self._require_loaded()
        return token_counts(self._tokenizer, inputs)

    def text_inputs(self, texts: Sequence[str]) -> Any:
        """The text tower's input: each text cut to the token limit, padded to the positions."""
        model = self._require_loaded()
        if self._token_limit == self._positions:
            batch = self._tokenizer(
                list(texts),
                padding="max_length",
                max_length=self._positions,
                truncation=True,
                return_tensors="pt",
            )
        else:
            cut = self._tokenizer(list(texts), truncation=True, max_length=self._token_limit)
            batch = self._tokenizer.pad(
                cut, padding="max_length", max_length=self._positions, return_tensors="pt"
            )
        return batch.to(model.device)

    def embed(self, inputs: Sequence[str]) -> np.ndarray:
        import torch

        model = self._require_loaded()
        rows = []
        for start in range(0, len(inputs), self.max_batch_inputs):
            batch = self.text_inputs(inputs[start : start + self.max_batch_inputs])
            with torch.inference_mode():
                rows.append(model.get_text_features(**batch).pooler_output)
        return self._vectors(torch.cat(rows), len(inputs))

    # -- images ---------------------------------------------------------------------------------

    def image_inputs(self, images: Sequence[PILImage.Image]) -> Any:
        """The image tower's input, as the artifact's image processor makes it."""
        model = self._require_loaded()
        batch = self._image_processor(list(images), return_tensors="pt").to(model.device)
        batch["pixel_values"] = batch["pixel_values"].to(model.dtype)
        return batch

    def embed_image(self, images: Sequence[PILImage.Image]) -> np.ndarray:
        import torch

        model = self._require_loaded()
        rows = []
        for start in range(0, len(images), self.max_batch_inputs):
            batch = self.image_inputs(images[start : start + self.max_batch_inputs])
            with torch.inference_mode():
                rows.append(model.get_image_features(**batch).pooler_output)
        return self._vectors(torch.cat(rows), len(images))

    def classify_image(self, images: Sequence[PILImage.Image], labels: Sequence[str]) -> np.ndarray:
        import numpy as np
        import torch

        model = self._require_loaded()
        text = self.text_inputs(labels)
        rows = []
        for start in range(0, len(images), self.max_batch_inputs):
            pixels = self.image_inputs(images[start : start + self.max_batch_inputs])
            with torch.inference_mode():
                logits = model(**text, **pixels).logits_per_image
            rows.append(torch.sigmoid(logits).float().cpu().numpy())
        scores = np.concatenate(rows)
        if scores.shape != (len(images), len(labels)):
            raise RuntimeError(
                f"SigLIP2 scored {scores.shape} for {len(images)} images and {len(labels)} labels"
            )
        return scores

    def _vectors(self, features: Any, count: int) -> np.ndarray:
        import numpy as np
        import torch

        if self._normalize:
            features = torch.nn.functional.normalize(features.float(), p=2, dim=-1)
        vectors = features.float().cpu().numpy()
        if vectors.shape != (count, self._dim):
            raise RuntimeError(f"SigLIP2 returned {vectors.shape} for {count} inputs")
        return np.ascontiguousarray(vectors, dtype="<f4")

    # -- health ---------------------------------------------------------------------------------

    def health_check(self) -> ForwardCheck:
        """A generated gradient through the image tower: one finite row of the loaded width."""
        started = time.monotonic()
        vectors = self.embed_image([gradient()])
        return check_output(
            vectors,
            expected_shape=(1, self._dim),
            seconds=time.monotonic() - started,
            healthy=f"one finite image vector of width {vectors.shape[-1]}",
        )

    def worst_case_check(self) -> tuple[ForwardCheck, WorstCase]:
        """A batch of the batch size's images through the image tower (the processor brings every
        image to its patch budget, so only their number varies), then as many texts through the
        text tower (each padded to its positions, so only their number varies there too)."""
        batch = self.max_batch_inputs
        started = time.monotonic()
        images = self.embed_image([gradient()] * batch)
        texts = self.embed([worst_case_text(self._token_limit)] * batch)
        checks = [
            check_output(
                vectors,
                expected_shape=(batch, self._dim),
                seconds=time.monotonic() - started,
                healthy=f"{batch} finite image and text vectors of width {self._dim}",
            )
            for vectors in (images, texts)
        ]
        check = next((check for check in checks if not check.ok), checks[-1])
        detail = (
            f"{batch} images at the processor's size, then {batch} texts of {self._positions} "
            f"positions (batch size {batch})"
        )
        return check, WorstCase(batch_inputs=batch, input_tokens=self._positions, detail=detail)

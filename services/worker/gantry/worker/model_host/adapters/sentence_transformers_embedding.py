"""`sentence_transformers`: text embeddings from a SentenceTransformer, from local bytes only."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gantry.v1 import common_pb2
from gantry.worker.model_host.adapters.base import HEALTH_PROBE_TEXT, ForwardCheck, check_output
from gantry.worker.model_host.adapters.sentence_transformers_model import (
    SentenceTransformersAdapter,
)

if TYPE_CHECKING:
    import numpy as np


class SentenceTransformersEmbedding(SentenceTransformersAdapter):
    name = "sentence_transformers"
    task = "embedding"
    serves = frozenset({"embed"})

    def __init__(self) -> None:
        super().__init__()
        self._normalize = False
        # The model's declared width; until known, the first probe's width is taken as it.
        self._dim = 0

    def _load(self, model_directory: Path, settings: common_pb2.AdapterSettings) -> Any:
        # Imported here, after the offline flags, the network guard and the sandbox.
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(
            str(model_directory),
            device=settings.device or "cpu",
            local_files_only=self.local_files_only,
            trust_remote_code=self.trust_remote_code,
        )
        if settings.max_input_length:
            model.max_seq_length = settings.max_input_length
        self._normalize = settings.normalize
        self._dim = int(model.get_embedding_dimension() or 0)
        return model

    @property
    def dim(self) -> int:
        return self._dim

    def embed_token_counts(self, inputs: Sequence[str]) -> list[int]:
        model = self._require_loaded()
        # encode() puts the default prompt (if the model declares one) before each text.
        prompt = (model.prompts or {}).get(model.default_prompt_name or "", "")
        return self._token_counts([prompt + text for text in inputs])

    def embed(self, inputs: Sequence[str]) -> np.ndarray:
        import numpy as np

        vectors = self._require_loaded().encode(
            list(inputs),
            batch_size=self.max_batch_inputs,
            convert_to_numpy=True,
            normalize_embeddings=self._normalize,
            show_progress_bar=False,
        )
        if vectors.ndim != 2 or vectors.shape[0] != len(inputs):
            raise RuntimeError(f"encoder returned shape {vectors.shape} for {len(inputs)} inputs")
        return np.ascontiguousarray(vectors, dtype="<f4")

    def health_check(self) -> ForwardCheck:
        started = time.monotonic()
        vectors = self.embed([HEALTH_PROBE_TEXT])
        check = check_output(
            vectors,
            expected_shape=(1, 0),
            seconds=time.monotonic() - started,
            healthy=f"one finite row of width {vectors.shape[-1]}",
        )
        if check.ok and self._dim and check.shape[1] != self._dim:
            problem = f"probe width {check.shape[1]} != loaded dimension {self._dim}"
            return check.failed(problem)
        if check.ok and not self._dim:
            self._dim = check.shape[1]
        return check

"""`sentence_transformers`: text embeddings from a SentenceTransformer, from local bytes only."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gantry.v1 import common_pb2
from gantry.worker.model_host.adapters.base import (
    HEALTH_PROBE_TEXT,
    ForwardCheck,
    WorstCase,
    check_output,
    worst_case_text,
)
from gantry.worker.model_host.adapters.sentence_transformers_model import (
    SentenceTransformersAdapter,
    TraceChecks,
    default_prompt,
)

if TYPE_CHECKING:
    import numpy as np
    import torch

# A second short check input, longer than the probe's: the two as one batch pad the shorter one.
_CHECK_TEXT = "A model host serves what it checked; the traced pass is checked before it serves."


class SentenceTransformersEmbedding(SentenceTransformersAdapter):
    name = "sentence_transformers"
    task = "embedding"
    serves = frozenset({"embed"})
    # Its tokenizer's uses are serialised (SentenceTransformersAdapter), the rest of a pass holds
    # only its own tensors.
    concurrent_passes = True

    def __init__(self) -> None:
        super().__init__()
        self._normalize = False
        # The model's declared width; until known, the first probe's width is taken as it.
        self._dim = 0

    def _trace_checks(self, long_tokens: int) -> TraceChecks:
        return TraceChecks(
            alone=[HEALTH_PROBE_TEXT, _CHECK_TEXT, worst_case_text(long_tokens)],
            together=[HEALTH_PROBE_TEXT, _CHECK_TEXT],
            output="sentence_embedding",
        )

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
        # The pass puts the default prompt (if the model declares one) before each text.
        prompt = default_prompt(self._require_loaded())
        return self._token_counts([prompt + text for text in inputs])

    def embed(self, inputs: Sequence[str]) -> np.ndarray:
        import numpy as np

        # No input: an empty answer, refused below like any row count that is off.
        vectors = self._passes(list(inputs), self._rows)
        if vectors.ndim != 2 or vectors.shape[0] != len(inputs):
            raise RuntimeError(f"encoder returned shape {vectors.shape} for {len(inputs)} inputs")
        return np.ascontiguousarray(vectors, dtype="<f4")

    def _rows(self, outputs: dict[str, Any]) -> torch.Tensor:
        """The sentence embeddings of a pass, as encode() returns them: cut to the model's
        truncate_dim, normalised when the deployment asks."""
        import torch
        from sentence_transformers.util import truncate_embeddings

        model = self._require_loaded()
        embeddings = outputs["sentence_embedding"]
        if model.truncate_dim is not None:
            embeddings = truncate_embeddings(embeddings, model.truncate_dim)
        if self._normalize:
            embeddings = torch.nn.functional.normalize(embeddings, p=2, dim=1)
        return embeddings

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

    def worst_case_check(self) -> tuple[ForwardCheck, WorstCase]:
        """One batch of the batch size's inputs, each as long as the model takes: the largest
        forward pass the host runs for this profile (a request's batch is cut to that size)."""
        batch = self.max_batch_inputs
        length, why = self.worst_case_length()
        text = worst_case_text(length)
        tokens = self.worst_case_tokens(lambda: self.embed_token_counts([text])[0], length)
        started = time.monotonic()
        vectors = self.embed([text] * batch)
        check = check_output(
            vectors,
            expected_shape=(batch, self._dim),
            seconds=time.monotonic() - started,
            healthy=f"{batch} finite rows of width {vectors.shape[-1]}",
        )
        detail = self.worst_case_detail(batch, tokens, why)
        return check, WorstCase(batch_inputs=batch, input_tokens=tokens, detail=detail)

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
        # The pass puts the default prompt (if the model declares one) before each text.
        prompt = _default_prompt(self._require_loaded())
        return self._token_counts([prompt + text for text in inputs])

    def embed(self, inputs: Sequence[str]) -> np.ndarray:
        import numpy as np

        model = self._require_loaded()
        texts = list(inputs)
        size = self.max_batch_inputs
        # The serving loop hands at most a batch at a time (its chunks); a longer list still
        # runs in passes of the batch size, as encode() would.
        parts = [
            _one_pass(model, texts[i : i + size], self._normalize)
            for i in range(0, len(texts), size)
        ]
        vectors = parts[0] if len(parts) == 1 else np.concatenate(parts)
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


def _default_prompt(model: Any) -> str:
    """The prompt encode() puts before each text: the model's default one, if it declares one."""
    return str((model.prompts or {}).get(model.default_prompt_name or "", "") or "")


def _one_pass(model: Any, texts: list[str], normalize: bool) -> np.ndarray:
    """What `SentenceTransformer.encode(texts, batch_size=len(texts))` returns, as float32 rows in
    the texts' order, from one forward pass: its preprocessing (the default prompt, the
    tokenizer's truncation and padding), the model's modules, its truncate_dim and the optional
    normalisation, without the work encode() repeats on every call around them (putting every
    module in eval mode, which `load` did once; finding the device by walking every parameter;
    sorting by length and back).

    Measured on 2 CPUs with all-MiniLM-L6-v2, one sentence: in-process 10.3-10.5 ms a call through
    encode(), 8.9-9.2 ms this way; through Gantry (`gantry up`, c=1 in blocks against the untuned
    encode, same session) the overhead went from +4.0/+4.8 to +2.4/+2.9 ms. The rows equal
    encode()'s (to the bit in that measurement; tests/integration/test_sentence_transformers_pass.py
    holds them within 1e-6)."""
    import torch
    from sentence_transformers.util import truncate_embeddings

    prompt = _default_prompt(model) or None
    with torch.inference_mode():
        features = model.preprocess(texts, prompt=prompt)
        device = model.device
        features = {
            name: value.to(device) if isinstance(value, torch.Tensor) else value
            for name, value in features.items()
        }
        embeddings = model(features)["sentence_embedding"]
        if model.truncate_dim is not None:
            embeddings = truncate_embeddings(embeddings, model.truncate_dim)
        if normalize:
            embeddings = torch.nn.functional.normalize(embeddings, p=2, dim=1)
        if embeddings.dtype == torch.bfloat16:
            embeddings = embeddings.float()
        return embeddings.cpu().numpy()

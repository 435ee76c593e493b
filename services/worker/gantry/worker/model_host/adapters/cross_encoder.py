"""`sentence_transformers_cross_encoder`: reranking with a sentence-transformers CrossEncoder.

Each document is scored against the query in one forward pass of the pair; the scores come back
in the documents' order (ordering them is the caller's business). Local bytes only, no remote code.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2
from gantry.worker.model_host.adapters import sentence_transformers_model
from gantry.worker.model_host.adapters.base import (
    HEALTH_PROBE_DOCUMENT,
    HEALTH_PROBE_QUERY,
    ForwardCheck,
    WorstCase,
    check_output,
    worst_case_text,
)

if TYPE_CHECKING:
    import numpy as np
    import torch

# A second short document for the traced pass's check, longer than the probe's: the two pairs as
# one batch pad the shorter one.
_CHECK_DOCUMENT = "A model host serves the pass it checked; a traced one is checked first."


class SentenceTransformersCrossEncoder(sentence_transformers_model.SentenceTransformersAdapter):
    name = "sentence_transformers_cross_encoder"
    task = "reranking"
    serves = frozenset({"rerank"})

    def _load(self, model_directory: Path, settings: common_pb2.AdapterSettings) -> Any:
        # Imported here, after the offline flags, the network guard and the sandbox.
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(
            str(model_directory),
            device=settings.device or "cpu",
            local_files_only=self.local_files_only,
            trust_remote_code=self.trust_remote_code,
            max_length=settings.max_input_length or None,
        )
        if model.num_labels != 1:
            raise GantryError(
                "RUNTIME_INCOMPATIBLE",
                f"the cross-encoder has {model.num_labels} output labels; reranking needs "
                "exactly one score per query/document pair",
                adapter=self.name,
            )
        return model

    def _trace_checks(self, long_tokens: int) -> sentence_transformers_model.TraceChecks:
        short = (HEALTH_PROBE_QUERY, HEALTH_PROBE_DOCUMENT)
        longer = (HEALTH_PROBE_QUERY, _CHECK_DOCUMENT)
        return sentence_transformers_model.TraceChecks(
            alone=[short, longer, (HEALTH_PROBE_QUERY, worst_case_text(long_tokens))],
            together=[short, longer],
            output="scores",
        )

    def rerank_token_counts(self, query: str, documents: Sequence[str]) -> list[int]:
        return self._token_counts([query] * len(documents), documents)

    def rerank(self, query: str, documents: Sequence[str]) -> np.ndarray:
        import numpy as np

        pairs = [(query, document) for document in documents]
        scores = np.asarray(
            self._passes(pairs, self._scores),
            dtype="<f4",
        )
        if scores.shape != (len(documents),):
            raise RuntimeError(
                f"cross-encoder returned shape {scores.shape} for {len(documents)} documents"
            )
        return scores

    def _scores(self, outputs: dict[str, Any]) -> torch.Tensor:
        """A pass's one score per pair, as predict() returns them: the logits in 32 bits at
        least, through the model's activation (a sigmoid for its one label unless it names
        another), one per pair."""
        import torch

        scores = outputs["scores"]
        if torch.is_floating_point(scores) and torch.finfo(scores.dtype).bits < 32:
            scores = scores.float()
        activation = self._require_loaded().activation_fn
        if activation is not None:
            scores = activation(scores)
        return scores.squeeze(-1) if scores.ndim > 1 else scores

    def health_check(self) -> ForwardCheck:
        started = time.monotonic()
        scores = self.rerank(HEALTH_PROBE_QUERY, [HEALTH_PROBE_DOCUMENT])
        return check_output(
            scores,
            expected_shape=(1,),
            seconds=time.monotonic() - started,
            healthy="one finite score for the probe pair",
        )

    def worst_case_check(self) -> tuple[ForwardCheck, WorstCase]:
        """One batch of the batch size's pairs, each as long as the model takes (the query and
        the document together past the limit, cut to it): the largest forward pass it runs."""
        batch = self.max_batch_inputs
        length, why = self.worst_case_length()
        query, document = worst_case_text(length // 2), worst_case_text(length)
        tokens = self.worst_case_tokens(
            lambda: self.rerank_token_counts(query, [document])[0], length
        )
        started = time.monotonic()
        scores = self.rerank(query, [document] * batch)
        check = check_output(
            scores,
            expected_shape=(batch,),
            seconds=time.monotonic() - started,
            healthy=f"{batch} finite scores",
        )
        detail = self.worst_case_detail(batch, tokens, why)
        return check, WorstCase(batch_inputs=batch, input_tokens=tokens, detail=detail)

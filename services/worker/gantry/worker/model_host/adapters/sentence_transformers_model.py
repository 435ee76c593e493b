"""What the sentence-transformers adapters (embedding, cross-encoder) share: the token limit a
loaded model declares, and how many tokens it makes of each input."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gantry.worker.model_host.adapters.base import (
    UNDECLARED_LENGTH_PROBED,
    ModelAdapter,
    declared_token_limit,
    token_counts,
)


class SentenceTransformersAdapter(ModelAdapter):
    """An adapter whose loaded model is a sentence-transformers object (a SentenceTransformer or
    a CrossEncoder): it carries its tokenizer and its `max_seq_length`."""

    @property
    def token_limit(self) -> int:
        # A model without a text tokenizer (or a stand-in) declares nothing to enforce.
        model = self._require_loaded()
        if getattr(model, "tokenizer", None) is None:
            return 0
        return declared_token_limit(getattr(model, "max_seq_length", None))

    def _token_counts(self, *texts: Sequence[str]) -> list[int]:
        """Tokens per text (or per pair, given two sequences), as the loaded model's tokenizer
        makes them (`base.token_counts`)."""
        return token_counts(self._require_loaded().tokenizer, *texts)

    def worst_case_length(self) -> tuple[int, str]:
        """(tokens, why) an input of the worst case holds: the model's limit, to which the
        library truncates longer inputs, or a fixed length for a model that declares none."""
        limit = self.token_limit
        if limit:
            return limit, f"the model's limit of {limit} tokens"
        return UNDECLARED_LENGTH_PROBED, "no declared token limit"

    def worst_case_tokens(self, count: Callable[[], int], length: int) -> int:
        """The tokens a worst-case input held: `count()` of it untruncated, cut to the limit the
        library cuts to; 0 for a model without a tokenizer to count by."""
        if getattr(self._require_loaded(), "tokenizer", None) is None:
            return 0
        counted = count()
        return min(counted, length) if self.token_limit else counted

    def worst_case_detail(self, batch: int, tokens: int, why: str) -> str:
        each = f"{tokens} tokens" if tokens else "uncounted tokens (no tokenizer)"
        return f"{batch} inputs of {each} (batch size {self.max_batch_inputs}; {why})"

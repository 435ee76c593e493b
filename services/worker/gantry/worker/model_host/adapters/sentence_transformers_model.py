"""What the sentence-transformers adapters (embedding, cross-encoder) share: the token limit a
loaded model declares, and how many tokens it makes of each input."""

from __future__ import annotations

from collections.abc import Sequence

from gantry.worker.model_host.adapters.base import ModelAdapter, declared_token_limit, token_counts


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

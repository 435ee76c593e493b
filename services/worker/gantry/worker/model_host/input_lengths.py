"""Inputs past the model's token limit: refused as the client's error unless truncation is asked.

Sentence-transformers cuts every text to the model's limit without a word; a client that sent a
100,000-character text would get the vector of its first few hundred tokens and never know. So a
request without `truncate` is counted with the model's own tokenizer first, and the first input
past the limit is INPUT_TOO_LONG (INVALID_ARGUMENT, class REQUEST: it says nothing about the
runtime, so no breaker, crash or degradation accounting sees it). With `truncate` nothing is
counted and the library cuts as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from gantry.common.errors import GantryError
from gantry.v1 import model_host_pb2
from gantry.worker.model_host.adapters import ModelAdapter


def first_overlong(
    counts: Sequence[int], limit: int, *, field: str, what: str = ""
) -> GantryError | None:
    """INPUT_TOO_LONG for the first of `counts` past `limit` (0: no limit), else None."""
    if limit <= 0:
        return None
    for index, tokens in enumerate(counts):
        if tokens > limit:
            return GantryError(
                "INPUT_TOO_LONG",
                f"{field}[{index}]{what} is {tokens} tokens long; the model takes at most "
                f"{limit} (set truncate to cut it to the limit)",
                field=f"{field}[{index}]",
                input_index=str(index),
                tokens=str(tokens),
                limit=str(limit),
            )
    return None


def length_refusal(
    adapter: ModelAdapter, request: model_host_pb2.HostRequest
) -> GantryError | None:
    """Why this embed or rerank request is refused for its length, or None to run it."""
    kind = request.WhichOneof("kind")
    if kind == "embed" and not request.embed.truncate:
        limit = adapter.token_limit
        if limit:
            counts = adapter.embed_token_counts(list(request.embed.inputs))
            return first_overlong(counts, limit, field="inputs")
    if kind == "rerank" and not request.rerank.truncate:
        limit = adapter.token_limit
        if limit:
            payload = request.rerank
            counts = adapter.rerank_token_counts(payload.query, list(payload.documents))
            return first_overlong(counts, limit, field="documents", what=" with the query")
    return None

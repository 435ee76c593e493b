"""The checks on one Embed or Rerank call before anything is scheduled: pure, no IO. The media
calls' checks (media_validation.py) build on the same refusals.

Every refusal is INVALID_ARGUMENT and names the offending `field` (`inputs`, `inputs[3]`, `query`,
`documents[7]`). A limit refusal keeps its reason (INVALID_PAYLOAD) and carries the server's
`limit`, the request's `value` and the `setting` that holds the limit, so a client can read the
server's own limit from the error. An empty text is EMPTY_INPUT: only the empty string; a text of
spaces is a text (the tokenizer gives it its special tokens, as sentence-transformers does).
"""

from __future__ import annotations

from collections.abc import Sequence

from gantry.common.errors import GantryError, invalid_argument
from gantry.common.inference_limits import DEFAULT_LIMITS, InferenceLimits


def over_limit(
    message: str, *, setting: str, limit: int, value: int | str, field: str
) -> GantryError:
    """INVALID_PAYLOAD naming the field, the setting, the server's limit and the request's value."""
    return GantryError(
        "INVALID_PAYLOAD",
        message,
        field=field,
        setting=setting,
        limit=str(limit),
        value=str(value),
    )


def _check_count(count: int, *, field: str, limits: InferenceLimits) -> None:
    if count > limits.max_inputs:
        raise over_limit(
            f"{count} {field} in one call; this server takes at most {limits.max_inputs}",
            setting="max_inputs",
            limit=limits.max_inputs,
            value=count,
            field=field,
        )


def check_total(texts: Sequence[str], *, field: str, limits: InferenceLimits) -> None:
    total = sum(len(text.encode("utf-8", errors="surrogatepass")) for text in texts)
    if total > limits.max_request_bytes:
        error = over_limit(
            f"the call holds {total} bytes of text; this server takes at most "
            f"{limits.max_request_bytes} per call",
            setting="max_request_bytes",
            limit=limits.max_request_bytes,
            value=total,
            field=field,
        )
        error.metadata["limit_bytes"] = str(limits.max_request_bytes)  # the name clients knew
        raise error


def check_text(text: str, *, field: str, limits: InferenceLimits) -> None:
    """One text: not the empty string, and within max_input_chars."""
    if not text:
        raise GantryError("EMPTY_INPUT", f"{field} is an empty string", field=field)
    if len(text) > limits.max_input_chars:
        raise over_limit(
            f"{field} holds {len(text)} characters; this server takes at most "
            f"{limits.max_input_chars} per text",
            setting="max_input_chars",
            limit=limits.max_input_chars,
            value=len(text),
            field=field,
        )


def validate_inputs(inputs: Sequence[str], limits: InferenceLimits = DEFAULT_LIMITS) -> None:
    """An Embed call's inputs: at least one, within the count, the whole call's bytes, and each
    text non-empty and within its characters."""
    if not inputs:
        raise invalid_argument("inputs must hold at least one text", field="inputs")
    _check_count(len(inputs), field="inputs", limits=limits)
    check_total(inputs, field="inputs", limits=limits)
    for index, text in enumerate(inputs):
        check_text(text, field=f"inputs[{index}]", limits=limits)


def validate_rerank(
    query: str, documents: Sequence[str], limits: InferenceLimits = DEFAULT_LIMITS
) -> None:
    """The same bounds as Embed's inputs: the query, the documents count, each text, the call."""
    check_text(query, field="query", limits=limits)
    if not documents:
        raise invalid_argument("documents must hold at least one text", field="documents")
    _check_count(len(documents), field="documents", limits=limits)
    check_total((query, *documents), field="documents", limits=limits)
    for index, text in enumerate(documents):
        check_text(text, field=f"documents[{index}]", limits=limits)

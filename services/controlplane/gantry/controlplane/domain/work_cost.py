"""What one inference call costs the scheduler's fair queue and budgets: bytes of UTF-8 text.

The invariant: every call costs at least 1, and the same request always costs the same. A rerank
scores the query against every document, so the query counts once per document.
"""

from __future__ import annotations

from collections.abc import Sequence


def _utf8_bytes(text: str) -> int:
    # surrogatepass: the same count the request-size check uses, for any str it may hold.
    return len(text.encode("utf-8", errors="surrogatepass"))


def embed_cost(inputs: Sequence[str]) -> int:
    return max(1, sum(_utf8_bytes(text) for text in inputs))


def rerank_cost(query: str, documents: Sequence[str]) -> int:
    return max(
        1, _utf8_bytes(query) * len(documents) + sum(_utf8_bytes(text) for text in documents)
    )

"""What one inference call costs the scheduler's fair queue and budgets, in one unit for every kind.

The invariant: every call costs at least 1, and the same request always costs the same. The unit is
a byte of UTF-8 text, what Embed and Rerank have always cost; a text model reads about 4 bytes per
token, so 1,000 units is about 250 tokens of a text model's work. Media are priced in that unit
from what the control plane reads in their headers (never by decoding):

- A rerank scores the query against every document, so the query counts once per document.
- An image costs IMAGE_BASE_UNITS (the model's forward pass on its fixed-size input: a ViT or
  SigLIP at 224-384 px sees 196-576 patches, about as many tokens as 1 KiB of text) plus one unit
  per PIXELS_PER_UNIT pixels sent (decoding and resizing grow with the pixels: a 12 MP photo adds
  12,000, a 224 x 224 thumbnail 51). So a batch of thumbnails weighs like a batch of short texts,
  and a call of large photos like a long document.
- A clip costs AUDIO_UNITS_PER_SECOND per second of audio (rounded up): a 30 s Whisper window is an
  encoder pass over 1,500 frames plus one decoder step per output token, about what embedding
  30 KiB of text costs (7,500 tokens), so 30,000 for the window.
- A ClassifyImage call costs its images plus the bytes of its labels (each label is encoded once
  per call; scoring images against labels is a dot product, too small to count).
- A generation costs its prompt's bytes (the prompt, or every chat message's content) plus
  TOKEN_UNITS per token it may produce (max_tokens, which the control plane always fills in before
  counting: the call's default when it names none). The prompt is read once, in one forward pass;
  each new token is one more pass, so the answer's half is priced as the text it would be, 4 bytes a
  token. Counted up front, at the most the call may produce: the fair queue decides before anyone
  knows where the model will stop, and a caller who asks 4,096 tokens to get 10 is charged for
  reserving 4,096.

These weights are a choice, not a measurement: they make the fair queue and budgets see media as
work of the right order of magnitude. Changing them changes no contract (costs are relative).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

IMAGE_BASE_UNITS = 1024
PIXELS_PER_UNIT = 1000
AUDIO_UNITS_PER_SECOND = 1000
TOKEN_UNITS = 4  # a token of text is about 4 bytes of it


def _utf8_bytes(text: str) -> int:
    # surrogatepass: the same count the request-size check uses, for any str it may hold.
    return len(text.encode("utf-8", errors="surrogatepass"))


def embed_cost(inputs: Sequence[str]) -> int:
    return max(1, sum(_utf8_bytes(text) for text in inputs))


def rerank_cost(query: str, documents: Sequence[str]) -> int:
    return max(
        1, _utf8_bytes(query) * len(documents) + sum(_utf8_bytes(text) for text in documents)
    )


def image_cost(pixels: Iterable[int]) -> int:
    """Images of these pixel counts (width x height each, from their headers)."""
    return max(
        1, sum(IMAGE_BASE_UNITS + math.ceil(max(0, count) / PIXELS_PER_UNIT) for count in pixels)
    )


def audio_cost(seconds: float) -> int:
    """A clip of this many seconds (from its header)."""
    if not math.isfinite(seconds) or seconds <= 0:
        return 1
    return max(1, math.ceil(seconds * AUDIO_UNITS_PER_SECOND))


def classify_cost(pixels: Iterable[int], labels: Sequence[str]) -> int:
    """Images scored against labels: the images, and each label's text once."""
    return image_cost(pixels) + sum(_utf8_bytes(label) for label in labels)


def generate_cost(prompt_texts: Sequence[str], max_tokens: int) -> int:
    """A generation: the bytes of its prompt (or of its chat messages' contents) plus TOKEN_UNITS
    for each token it may produce."""
    return max(
        1, sum(_utf8_bytes(text) for text in prompt_texts) + TOKEN_UNITS * max(0, max_tokens)
    )

"""The bounds on one Inference call, shared by the control plane that enforces them and the CLI
that splits its calls (and refuses bench flags) to stay inside them."""

from __future__ import annotations

MAX_INPUTS = 1024  # texts (Embed) or documents (Rerank) per call
MAX_INPUT_CHARS = 100_000  # characters per text
# The whole request's text, so the Invoke built from it stays far inside the worker stream's
# message limit: an oversize call gets a typed error, never a torn-down worker stream.
MAX_REQUEST_TEXT_BYTES = 8 * 1024 * 1024

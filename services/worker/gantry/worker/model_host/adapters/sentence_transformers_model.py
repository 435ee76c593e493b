"""What the sentence-transformers adapters (embedding, cross-encoder) share: the token limit a
loaded model declares, how many tokens it makes of each input, and one forward pass as the
library's encode()/predict() runs it for one batch (`one_pass`)."""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gantry.v1 import common_pb2
from gantry.worker.model_host.adapters.base import (
    UNDECLARED_LENGTH_PROBED,
    ModelAdapter,
    RuntimeFacts,
    declared_token_limit,
    token_counts,
)
from gantry.worker.model_host.adapters.traced_encoder import (
    FORWARD_PASS_KEY,
    Forward,
    choose_forward,
)

if TYPE_CHECKING:
    import numpy as np
    import torch

# The traced pass is checked on one input this many tokens long (or the model's limit, if lower):
# a shape well past the trace's, at a cost the load can bear (an eager pass at a long model's
# limit, 8,192 tokens, would take it minutes; checking MiniLM at its 256, with the three inputs
# also padded together, made a warm load 1.38 s, against 0.85 s now).
CHECK_TOKENS_MAX = 128


@dataclass(frozen=True)
class TraceChecks:
    """What an adapter's traced pass is traced and checked on (traced_encoder.choose_forward):
    `together`, two short inputs of different lengths (texts, or query/document pairs) as one
    padded batch, and each of `alone` by itself; `output` is the features key it reads."""

    alone: list[Any]
    together: list[Any]
    output: str


class SentenceTransformersAdapter(ModelAdapter):
    """An adapter whose loaded model is a sentence-transformers object (a SentenceTransformer or
    a CrossEncoder): it carries its tokenizer and its `max_seq_length`. On the CPU its passes run
    the traced encoder where it was checked equal to the eager pass (traced_encoder.py), and the
    load's evidence says which pass serves."""

    def __init__(self) -> None:
        super().__init__()
        # The modules' pass: the traced encoder where it was checked, else the model's own call.
        self._forward: Forward | None = None
        # Held around every use of the tokenizer: a fast tokenizer's call sets its truncation and
        # padding first when they differ from the last call's (the token count's untruncated,
        # the pass's truncated), and a call on another thread between the two (passes side by
        # side: pass_lanes.py) would tokenize with the other's settings, or raise "Already
        # borrowed" from Rust.
        self._tokenizing = threading.Lock()

    def load(self, model_directory: Path, settings: common_pb2.AdapterSettings) -> RuntimeFacts:
        facts = super().load(model_directory, settings)
        checks = self._trace_checks(min(self.worst_case_length()[0], CHECK_TOKENS_MAX))
        choice = choose_forward(
            self._require_loaded(),
            alone=checks.alone,
            together=checks.together,
            output=checks.output,
        )
        self._forward = choice.forward
        facts.versions[FORWARD_PASS_KEY] = choice.evidence
        return facts

    @abc.abstractmethod
    def _trace_checks(self, long_tokens: int) -> TraceChecks:
        """The inputs the traced pass is checked on, one of them `long_tokens` long."""

    def release(self) -> None:
        self._forward = None  # it holds the model, and its graph the weights
        super().release()

    def _passes(
        self, inputs: Sequence[Any], output: Callable[[dict[str, Any]], torch.Tensor]
    ) -> np.ndarray:
        """`in_passes` over `inputs` on the loaded model, through the pass that serves."""
        return in_passes(
            self._require_loaded(),
            inputs,
            self.max_batch_inputs,
            output,
            self._forward,
            tokenizing=self._tokenizing,
        )

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
        with self._tokenizing:
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


def default_prompt(model: Any) -> str:
    """The prompt encode() and predict() put before each input: the model's default, if any."""
    return str((model.prompts or {}).get(model.default_prompt_name or "", "") or "")


def one_pass(
    model: Any,
    inputs: Sequence[Any],
    output: Callable[[dict[str, Any]], torch.Tensor],
    forward: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    tokenizing: contextlib.AbstractContextManager[object] | None = None,
) -> np.ndarray:
    """One forward pass over `inputs` (texts, or query/document pairs) as the library's encode()
    and predict() run one batch: its preprocessing (the default prompt, the tokenizer's
    truncation and padding) and the model's modules; `output` takes the rows from what the
    modules return (an adapter's own part: which output, truncation, normalisation, activation).
    `forward` runs the modules instead of the model's own call where the adapter compiled them
    (traced_encoder.py); `tokenizing` is held while the tokenizer runs (the adapter's lock). The
    rows come back in the inputs' order, as float32 where the model ran
    in 16 bits.

    What it leaves out is what those calls repeat on every call around the pass: putting every
    module in eval mode (`load` did that once), finding the device by walking every parameter,
    and sorting the inputs by length and back (one batch pads to its longest either way).
    Measured on 2 CPUs with all-MiniLM-L6-v2, one sentence: in-process 10.3-10.5 ms a call
    through encode(), 8.9-9.2 ms this way; through Gantry (`gantry up`, c=1 in blocks against the
    untuned encode, same session) the overhead went from +4.0/+4.8 to +2.4/+2.9 ms. The rows
    equal the library's (to the bit in that measurement; tests/integration/
    test_sentence_transformers_pass.py holds both adapters' within 1e-6)."""
    import torch

    prompt = default_prompt(model) or None
    with torch.inference_mode():
        with tokenizing or contextlib.nullcontext():
            features = model.preprocess(list(inputs), prompt=prompt)
        device = model.device
        features = {
            name: value.to(device) if isinstance(value, torch.Tensor) else value
            for name, value in features.items()
        }
        rows = output((forward or model)(features))
        if torch.is_floating_point(rows) and torch.finfo(rows.dtype).bits < 32:
            rows = rows.float()
        return rows.cpu().numpy()


def in_passes(
    model: Any,
    inputs: Sequence[Any],
    size: int,
    output: Callable[[dict[str, Any]], torch.Tensor],
    forward: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    *,
    tokenizing: contextlib.AbstractContextManager[object] | None = None,
) -> np.ndarray:
    """`one_pass` over `inputs` in passes of at most `size` (the batch size), as encode() and
    predict() batch them; the rows in the inputs' order (none: an empty array). The serving loop
    hands at most a batch at a time, so this is one pass there."""
    import numpy as np

    parts = [
        one_pass(model, inputs[i : i + size], output, forward, tokenizing)
        for i in range(0, len(inputs), size)
    ]
    return np.concatenate(parts) if parts else np.zeros((0,), dtype="<f4")

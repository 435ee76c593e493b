"""A CPU host's compiled encoder: a sentence-transformers model's transformer (an embedding
model's, a cross-encoder's) traced once at load, frozen (its weights as the graph's constants)
and optimised for inference (oneDNN's prepacked matrix products and fused ops), then checked
against the eager pass before it serves a call.

Why: on the CPU a short input's pass is mostly transformers' eager matrix products and the ops
around them, which oneDNN's prepacked and fused kernels do in less. all-MiniLM-L6-v2 alone in a
process, one sentence on 2 threads of a 2-vCPU machine, four rounds alternated: eager 6.3-10.1 ms a
pass, traced and frozen 4.3-7.2 ms, also optimised 3.3-4.9 ms; `torch.export` alone, with no such
kernels, ran as eager did (11.2 against 11.2 ms in one run), so the gain is the kernels, not
Python. The trace and the check take 0.4-0.6 s at load; the prepacked weights are a copy (a further
MiniLM host adds 118-132 MiB to the machine's PSS, against about 57 MiB eager).

Only where it is checked: the traced graph is a recording of one pass, and a model whose Python
takes a branch on its input's shape or values would record that branch only. So before it is used
it runs beside the eager pass on inputs of other shapes than it was traced with (the adapter's: two
short inputs, texts or query/document pairs, and a long one, each alone, and the short ones as one
padded batch, which it was traced on) and is kept only if every output (sentence embedding, score)
agrees to float rounding (`TOLERANCE`). Otherwise, on any other device than the CPU, for a model
that is not float32, or when tracing fails (`torch.jit` is deprecated in torch 2.13 and may go),
the host serves the eager pass. Either way the load's evidence says which pass serves and why
(`FORWARD_PASS_KEY` in runtime_versions): never a silent fallback.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

FORWARD_PASS_KEY = "forward_pass"
# Sentence embeddings of the traced and eager passes may differ by float rounding only: fused and
# prepacked kernels sum in another order (measured: at most 3.3e-6 on all-MiniLM-L6-v2).
TOLERANCE = 1e-4
# The feature names a text transformer takes as tensors, in the traced graph's argument order.
_TENSOR_FEATURES = ("input_ids", "attention_mask", "token_type_ids")

Features = dict[str, Any]
Forward = Callable[[Features], Features]


@dataclass(frozen=True)
class EncoderChoice:
    """The pass a host serves (`forward`: features -> features, as the model's own call) and the
    load evidence's line saying which and why."""

    forward: Forward
    evidence: str


def choose_forward(
    model: Any, *, alone: Sequence[Any], together: Sequence[Any], output: str
) -> EncoderChoice:
    """The traced encoder for a loaded sentence-transformers model (a SentenceTransformer, a
    CrossEncoder) where it is checked equal to the eager pass, else the model itself, with why.

    `together` (two inputs or more, of different lengths: texts, or query/document pairs) is
    what it is traced on, as one padded batch; each of `alone` by itself gives it other shapes to
    be checked on, and `together` is checked too. `output` is the features key compared: what
    the adapter reads of the modules' pass (a SentenceTransformer's `sentence_embedding`, a
    CrossEncoder's `scores`)."""
    started = time.monotonic()
    try:
        why_not = _why_not_traceable(model)
        if why_not:
            return EncoderChoice(model, f"eager: {why_not}")
        traced = _TracedEncoder.build(model, together)
        batches = [[text] for text in alone] + ([list(together)] if together else [])
        worst = traced.difference_from(model, batches, output)
    except Exception as exc:  # a model tracing cannot record, or a torch without torch.jit
        logger.warning("serving the eager pass: tracing failed (%s)", exc)
        return EncoderChoice(model, f"eager: tracing failed ({type(exc).__name__}: {exc})"[:256])
    if worst > TOLERANCE:
        logger.warning("serving the eager pass: the traced one differs by %.3g", worst)
        return EncoderChoice(
            model, f"eager: the traced pass differed from it by {worst:.3g} (> {TOLERANCE:g})"
        )
    return EncoderChoice(
        traced,
        f"traced: torch.jit trace, freeze, optimize_for_inference in "
        f"{time.monotonic() - started:.1f}s; equal to the eager pass within {worst:.2g} on "
        f"{len(alone)} inputs alone and {len(together)} as one padded batch",
    )


def _why_not_traceable(model: Any) -> str:
    """Why a model is served by its eager pass without trying, or "" to try."""
    import torch

    if model.device.type != "cpu":
        return f"device {model.device} (the traced pass is measured and checked on CPU only)"
    dtypes = {parameter.dtype for parameter in model.parameters()}
    if dtypes != {torch.float32}:
        return f"weights in {sorted(str(dtype) for dtype in dtypes)}, not float32 alone"
    first = model[0]
    if getattr(first, "modality_config", {}).get("text", {}).get("method") != "forward":
        return f"its first module ({type(first).__name__}) is not a text transformer's forward"
    config = getattr(getattr(first, "model", None), "config", None)
    if config is None or getattr(config, "output_hidden_states", False):
        return "its transformer's configuration asks for every layer's states"
    return ""


class _TracedEncoder:
    """The model's modules with its first (the transformer) replaced by a frozen graph of it."""

    def __init__(self, model: Any, graph: Any, names: tuple[str, ...], output_name: str) -> None:
        self._rest = list(model)[1:]  # pooling, normalisation, ...: run as the model runs them
        self._graph = graph
        self._names = names  # the tensor features the graph takes, in order
        self._output_name = output_name  # where the transformer puts its states (features key)

    @classmethod
    def build(cls, model: Any, together: Sequence[Any]) -> _TracedEncoder:
        import torch

        transformer = model[0]
        states_name = transformer.modality_config["text"]["method_output_name"]
        if not isinstance(states_name, str):
            (states_name,) = states_name  # one named output: last_hidden_state, logits
        # Traced on a padded batch, so the graph records the attention mask's use: traced on an
        # unpadded one, a model may record "no mask needed" and ignore a later batch's padding.
        example = model.preprocess(list(together))
        names = tuple(name for name in _TENSOR_FEATURES if name in example)
        hf_model = transformer.model

        class _Transformer(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = hf_model

            def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
                states = self.inner(**dict(zip(names, tensors, strict=True)), return_dict=True)
                return states[states_name]  # type: ignore[no-any-return]

        with torch.inference_mode(), warnings.catch_warnings():
            # The tracer's warnings name each Python branch it records: the check below is what
            # decides whether those recordings hold for other inputs.
            warnings.simplefilter("ignore")
            graph = torch.jit.trace(
                _Transformer().eval(),
                tuple(example[name] for name in names),
                check_trace=False,
            )
            graph = torch.jit.optimize_for_inference(torch.jit.freeze(graph))
        return cls(model, graph, names, transformer.module_output_name)

    def __call__(self, features: Features) -> Features:
        import torch

        # Run as frozen and optimised, not re-profiled: TorchScript's profiling executor would
        # time each new input shape's first runs and compile again (31-57 ms for a first call of
        # a new shape, measured) for no faster pass than this one (4.3 ms against 4.3-4.5).
        with torch.jit.optimized_execution(False):
            states = self._graph(*(features[name] for name in self._names))
        features[self._output_name] = states
        for module in self._rest:
            features = module(features)
        return features

    def difference_from(self, model: Any, batches: Sequence[list[Any]], output: str) -> float:
        """The largest difference of the two passes' `output` over `batches`."""
        import torch

        worst = 0.0
        with torch.inference_mode():
            for batch in batches:
                eager = model(model.preprocess(batch))[output]
                traced = self(model.preprocess(batch))[output]
                if traced.shape != eager.shape:
                    return float("inf")
                worst = max(worst, float((traced - eager).abs().max()))
        return worst

"""What every model host adapter does: load one model, run it, check it, and let it go.

An adapter module imports nothing heavy at import time: the child imports the registry before it
enters its sandbox, and numpy or torch would start thread pools there (see child.py). The ML stack
is imported inside `load`, which runs after the sandbox is entered.
"""

from __future__ import annotations

import abc
import gc
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2, worker_gateway_pb2

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image as PILImage

DEFAULT_MAX_BATCH_INPUTS = 32
HEALTH_PROBE_TEXT = "Gantry model host health probe."
# The fixed pair a cross-encoder scores for its health check.
HEALTH_PROBE_QUERY = "Gantry model host health probe."
HEALTH_PROBE_DOCUMENT = "A model host answers a real forward pass."


@dataclass(frozen=True, kw_only=True)
class ForwardCheck:
    """One real forward pass on the adapter's fixed probe input, and what it gave."""

    shape: tuple[int, ...]
    finite: bool
    seconds: float
    problem: str | None = None  # None: finite, non-empty and of the expected shape
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.problem is None

    def failed(self, problem: str) -> ForwardCheck:
        """This check, failed for `problem`: what the output's shape and values could not show
        (a width, an id outside the vocabulary) and the adapter found after judging them."""
        return replace(self, problem=problem, detail=problem)


# A model that declares no input or context length is probed at this many tokens (and says so):
# its worst case has no bound to run at.
UNDECLARED_LENGTH_PROBED = 512
# The words a worst-case input is made of: long enough inputs are cut to the limit by the library.
WORST_CASE_WORD = "gantry"


@dataclass(frozen=True, kw_only=True)
class WorstCase:
    """What a worst-case pass ran (`worker_gateway.WorstCasePass`): peak memory is read after it."""

    batch_inputs: int
    input_tokens: int
    generated_tokens: int = 0
    context_tokens: int = 0
    detail: str = ""


def worst_case_text(tokens: int) -> str:
    """A text of at least `tokens` tokens for any tokenizer (each word is one or more tokens)."""
    return " ".join([WORST_CASE_WORD] * max(1, tokens))


@dataclass(frozen=True, kw_only=True)
class RuntimeFacts:
    """What a load established: the output width (0 for a cross-encoder) and the runtime."""

    dim: int
    device: str
    versions: dict[str, str]


class ModelAdapter(abc.ABC):
    """One way of running a model in the host. Subclasses set the class attributes below."""

    name: ClassVar[str]
    # "embedding", "reranking", "speech_recognition", "ocr", "image_embedding", "text_generation"
    task: ClassVar[str]
    # The HostRequest kinds it answers: inference operations' kinds (gantry.common.operations:
    # "embed", "rerank", "transcribe", "recognize_text", "embed_image", "classify_image",
    # "generate", ...). A kind is answered by the method named as it: those below take what the
    # serving loop decoded; an operation without one here is given its worker payload and
    # returns its result message (media_serving), e.g. `def count_tokens(self, payload)`.
    serves: ClassVar[frozenset[str]]
    # What the adapter passes to the library, recorded as offline evidence (not assumed).
    local_files_only: ClassVar[bool] = True
    trust_remote_code: ClassVar[bool] = False
    # Whether two of its embed passes may run at once, on two threads (model_host/pass_lanes.py):
    # only an adapter that made its pass safe to share (its tokenizer's settings included) says so.
    concurrent_passes: ClassVar[bool] = False

    def __init__(self) -> None:
        self._model: Any = None
        self._device = "cpu"
        self._max_batch_inputs = DEFAULT_MAX_BATCH_INPUTS

    # -- lifecycle ------------------------------------------------------------------------------

    def load(self, model_directory: Path, settings: common_pb2.AdapterSettings) -> RuntimeFacts:
        """Load the model from local bytes only. Raises GantryError (LOAD_FAILED, ...)."""
        if not model_directory.is_dir():
            raise GantryError(
                "LOAD_FAILED", f"model directory {str(model_directory)!r} does not exist"
            )
        self._max_batch_inputs = settings.max_batch_size or DEFAULT_MAX_BATCH_INPUTS
        self._model = self._load(model_directory, settings)
        self._model.eval()
        self._device = str(self._model.device)
        return RuntimeFacts(dim=self.dim, device=self._device, versions=self.runtime_versions())

    @abc.abstractmethod
    def _load(self, model_directory: Path, settings: common_pb2.AdapterSettings) -> Any:
        """Construct the library's model object (with local_files_only, trust_remote_code)."""

    @abc.abstractmethod
    def health_check(self) -> ForwardCheck:
        """A real forward pass on a fixed input: finite, non-empty, of the expected shape."""

    def worst_case_check(self) -> tuple[ForwardCheck, WorstCase] | None:
        """One forward pass at the profile's worst case (its largest batch of its longest inputs),
        judged as `health_check` judges its own; None for an adapter that has none (its probe's
        peaks are then those of the health check's one input, and the evidence says so)."""
        return None

    def release(self) -> None:
        """Drop the model and hand its memory back (CUDA's cached blocks included)."""
        model, self._model = self._model, None
        del model
        gc.collect()
        if self.uses_cuda:
            import torch

            torch.cuda.synchronize(self._device)
            torch.cuda.empty_cache()

    # -- requests -------------------------------------------------------------------------------

    def embed(self, inputs: Sequence[str]) -> np.ndarray:
        raise self.unsupported("embed")

    def rerank(self, query: str, documents: Sequence[str]) -> np.ndarray:
        raise self.unsupported("rerank")

    def transcribe(
        self, payload: worker_gateway_pb2.TranscribePayload
    ) -> worker_gateway_pb2.TranscribeResult:
        """One clip's transcript (speech recognition adapters)."""
        raise self.unsupported("transcribe")

    # Image requests take decoded RGB images (`image_decoding`): the serving loop decodes them.

    def recognize_text(self, images: Sequence[PILImage.Image]) -> list[str]:
        """One text per image, in their order (OCR adapters)."""
        raise self.unsupported("recognize_text")

    def embed_image(self, images: Sequence[PILImage.Image]) -> np.ndarray:
        """One row of width `dim` per image, in the space `embed` puts texts in."""
        raise self.unsupported("embed_image")

    def classify_image(self, images: Sequence[PILImage.Image], labels: Sequence[str]) -> np.ndarray:
        """An images x labels array of probabilities in [0, 1], each label scored on its own."""
        raise self.unsupported("classify_image")

    def generate_text(
        self,
        payload: worker_gateway_pb2.GeneratePayload,
        *,
        on_text: Callable[[str, int], None] | None = None,
        between_tokens: Callable[[], bool] | None = None,
    ) -> worker_gateway_pb2.GenerateResult:
        """Text generated for a prompt or chat (text generation adapters): `on_text` gets each
        settled piece and the tokens so far, `between_tokens` says after each token whether to
        stop (the caller cancelled)."""
        raise self.unsupported("generate")

    # -- input lengths: refused unless the request asks for truncation --------------------------

    @property
    def token_limit(self) -> int:
        """The most tokens one input (a query + document pair for a cross-encoder) may hold, as
        the library truncates to; 0 when the model declares none (nothing is refused then)."""
        return 0

    def embed_token_counts(self, inputs: Sequence[str]) -> list[int]:
        """Each input's tokens as the forward pass would see them, untruncated."""
        raise self.unsupported("embed")

    def rerank_token_counts(self, query: str, documents: Sequence[str]) -> list[int]:
        """Each (query, document) pair's tokens as the forward pass would see them, untruncated."""
        raise self.unsupported("rerank")

    def unsupported(self, kind: str) -> GantryError:
        return GantryError(
            "INVALID_PAYLOAD",
            f"adapter {self.name!r} serves {self.task} ({', '.join(sorted(self.serves))} "
            f"requests); it cannot answer {kind} requests",
            adapter=self.name,
        )

    # -- facts ----------------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        """The embedding width; 0 for an adapter that does not embed."""
        return 0

    @property
    def device(self) -> str:
        return self._device

    @property
    def uses_cuda(self) -> bool:
        return self._device.startswith("cuda")

    @property
    def max_batch_inputs(self) -> int:
        return self._max_batch_inputs

    def library_versions(self) -> dict[str, str]:
        """The versions of the libraries beyond torch and transformers this adapter runs on."""
        import sentence_transformers

        return {"sentence_transformers": sentence_transformers.__version__}

    def runtime_versions(self) -> dict[str, str]:
        import torch
        import transformers

        device = self._model.device
        versions = {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            **self.library_versions(),
            "device": str(device),
        }
        if device.type == "cuda":
            versions["device_name"] = torch.cuda.get_device_name(device)
            versions["cuda_available"] = "true"
        else:
            versions["device_name"] = platform.processor() or "cpu"
            # Not asked on a CPU device: inside the sandbox the GPU nodes are not even visible.
            versions["cuda_available"] = "not checked (device is cpu)"
        return versions

    def _require_loaded(self) -> Any:
        if self._model is None:
            raise GantryError("INVOKE_FAILED", f"adapter {self.name!r} holds no loaded model")
        return self._model


def check_output(
    output: np.ndarray, *, expected_shape: tuple[int, ...], seconds: float, healthy: str
) -> ForwardCheck:
    """Judge a probe's output: non-empty, finite, and of `expected_shape` (0 = any non-zero).

    `healthy` is the detail of a passing check."""
    import numpy as np

    shape = tuple(int(size) for size in output.shape)
    finite = bool(np.isfinite(output).all()) if output.size else False
    problem: str | None = None
    if output.size == 0 or len(shape) != len(expected_shape):
        problem = f"probe returned shape {shape}"
    elif any(want and want != got for want, got in zip(expected_shape, shape, strict=True)):
        problem = f"probe returned shape {shape}, expected {expected_shape}"
    elif not finite:
        problem = "probe returned non-finite values"
    return ForwardCheck(
        shape=shape,
        finite=finite,
        seconds=seconds,
        problem=problem,
        detail=problem or healthy,
    )


# transformers' stand-in for "no declared maximum" is 1e30; a limit past this is no limit.
_NO_DECLARED_LIMIT = 1_000_000


def declared_token_limit(max_seq_length: object) -> int:
    """A library's `max_seq_length` as a limit to enforce; 0 when it declares none."""
    if isinstance(max_seq_length, int) and 0 < max_seq_length < _NO_DECLARED_LIMIT:
        return max_seq_length
    return 0


def token_counts(tokenizer: Any, *texts: Sequence[str]) -> list[int]:
    """Tokens per text (or per pair, given two sequences) with the special tokens the model adds,
    untruncated: what sentence-transformers feeds the model before cutting to its limit."""
    encoded = tokenizer(
        *(list(column) for column in texts),
        add_special_tokens=True,
        truncation=False,
        return_attention_mask=False,
        return_token_type_ids=False,
        verbose=False,  # the "longer than the maximum" warning is ours to answer, not to log
    )
    return [len(ids) for ids in encoded["input_ids"]]

"""`transformers_causal_lm`: text generation with a transformers causal LM, local bytes only.

A prompt is tokenized as the tokenizer does by default (its BOS included); chat messages are
rendered by the tokenizer's own chat template with the generation prompt, and a model without
one refuses them (INVALID_PAYLOAD, `messages`). Tokens come from transformers' own `generate`, so
greedy decoding (temperature 0) is exactly what `model.generate(..., do_sample=False)` gives, with
the model's generation config (its end tokens, repetition penalty, ...) as it stands. A stopping
criterion runs after every token, on this thread: it decodes the text so far, sends what is
settled (`generated_text`), and ends the generation at a stop sequence or when the caller has
cancelled. Sampling uses temperature, top_p and top_k; `generate` draws from torch's global
generator, so a seeded call forks the RNG state and seeds it (the same seed gives the same text;
an unseeded call after it is not made predictable).

Bounds: `max_tokens` at most the profile's `max_new_tokens`, `DEFAULT_MAX_NEW_TOKENS` (1024) when
that is 0 (a payload with none gets `DEFAULT_MAX_TOKENS`, 256, within it); a prompt at or past the
model's context length is INPUT_TOO_LONG; a generation that reaches the context ends LENGTH.
Texts are decoded with the special tokens skipped and no clean-up of spaces (that clean-up would
rewrite text already streamed), after a few prompt tokens so a leading space is kept.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gantry.common.errors import GantryError
from gantry.common.inference_limits import DEPLOYMENT_MAX_NEW_TOKENS
from gantry.v1 import common_pb2, worker_gateway_pb2
from gantry.worker.model_host.adapters.base import (
    HEALTH_PROBE_TEXT,
    UNDECLARED_LENGTH_PROBED,
    WORST_CASE_WORD,
    ForwardCheck,
    ModelAdapter,
    WorstCase,
    check_output,
    declared_token_limit,
)
from gantry.worker.model_host.generated_text import TextStream

# Without a profile's max_new_tokens: the bound the control plane resolves calls by.
DEFAULT_MAX_NEW_TOKENS = DEPLOYMENT_MAX_NEW_TOKENS
DEFAULT_MAX_TOKENS = 256
# The prompt tokens decoded before the new ones, so the first new token keeps its leading space
# (SentencePiece decoders strip the first token's).
_DECODE_CONTEXT_TOKENS = 4
PROBE_NEW_TOKENS = 4
# The worst case's prompt fills the context but for this many tokens, which it then generates: its
# KV cache ends at the context's length, the most it holds, and the prefill of the longest prompt
# is the largest activation. More generated tokens would cost the probe time, not memory.
WORST_CASE_NEW_TOKENS = 8
# On the CPU, where no VRAM is charged, the worst case's context is bounded by this: prefilling a
# long context there takes minutes (past the probe's check timeout) to measure RAM, whose charge
# keeps the operator's estimate as its floor.
CPU_WORST_CASE_CONTEXT = 2048
# config.json keys that name a causal LM's context length, most common first.
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length")

# Called with each settled piece of text and the tokens generated so far.
OnText = Callable[[str, int], None]
# Called after every token; True ends the generation (the caller cancelled).
BetweenTokens = Callable[[], bool]

FINISH_STOP = common_pb2.FINISH_REASON_STOP
FINISH_LENGTH = common_pb2.FINISH_REASON_LENGTH
FINISH_CANCELLED = common_pb2.FINISH_REASON_CANCELLED


def context_length(config: Any, tokenizer: Any) -> int:
    """The most tokens (prompt and generated) the model takes; 0 when nothing declares it."""
    for key in _CONTEXT_KEYS:
        limit = declared_token_limit(getattr(config, key, None))
        if limit:
            return limit
    return declared_token_limit(getattr(tokenizer, "model_max_length", None))


def sampling_arguments(sampling: common_pb2.SamplingSettings) -> dict[str, Any]:
    """`generate`'s arguments for `sampling`: greedy when the temperature is 0. INVALID_PAYLOAD
    names the field that is out of range."""
    temperature, top_p = sampling.temperature, sampling.top_p
    if not math.isfinite(temperature) or temperature < 0:
        raise GantryError(
            "INVALID_PAYLOAD",
            f"sampling.temperature must be 0 (greedy) or positive, not {temperature!r}",
            field="sampling.temperature",
        )
    if not math.isfinite(top_p) or not 0 <= top_p <= 1:
        raise GantryError(
            "INVALID_PAYLOAD",
            f"sampling.top_p must be in [0, 1] (0 = off), not {top_p!r}",
            field="sampling.top_p",
        )
    if temperature == 0:
        return {"do_sample": False}
    # Explicit "off" values: the model's generation config may carry its own top_k and top_p.
    return {
        "do_sample": True,
        "temperature": temperature,
        "top_p": top_p or 1.0,
        "top_k": sampling.top_k,
    }


class TransformersCausalLM(ModelAdapter):
    name = "transformers_causal_lm"
    task = "text_generation"
    serves = frozenset({"generate"})

    def __init__(self) -> None:
        super().__init__()
        self._tokenizer: Any = None
        self._max_new_tokens = DEFAULT_MAX_NEW_TOKENS
        self._context_length = 0
        self._end_ids: frozenset[int] = frozenset()

    def _load(self, model_directory: Path, settings: common_pb2.AdapterSettings) -> Any:
        # Imported here, after the offline flags, the network guard and the sandbox.
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            str(model_directory),
            local_files_only=self.local_files_only,
            trust_remote_code=self.trust_remote_code,
        )
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(model_directory),
            local_files_only=self.local_files_only,
            trust_remote_code=self.trust_remote_code,
        )
        self._tokenizer = tokenizer
        self._max_new_tokens = settings.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
        # The profile may cap the context below the model's own (prompt and generation together,
        # as llama.cpp's n_ctx does for the managed server); it never raises it.
        model_context = context_length(model.config, tokenizer)
        cap = settings.max_input_length
        self._context_length = min(model_context, cap) if cap and model_context else model_context
        end = model.generation_config.eos_token_id
        end_ids = end if isinstance(end, list) else [end] if end is not None else []
        self._end_ids = frozenset(int(token) for token in end_ids)
        return model.to(settings.device or "cpu")

    def library_versions(self) -> dict[str, str]:
        return {}

    @property
    def token_limit(self) -> int:
        return self._context_length

    @property
    def max_new_tokens(self) -> int:
        return self._max_new_tokens

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._tokenizer, "chat_template", None))

    # -- requests -------------------------------------------------------------------------------

    def generate_text(
        self,
        payload: worker_gateway_pb2.GeneratePayload,
        *,
        on_text: OnText | None = None,
        between_tokens: BetweenTokens | None = None,
    ) -> worker_gateway_pb2.GenerateResult:
        """Generate for one payload. `on_text` gets the settled text as it grows (the pieces join
        to the result's text); `between_tokens` is asked after each token whether to stop (then
        the finish reason is CANCELLED). Raises GantryError: INVALID_PAYLOAD naming the field,
        INPUT_TOO_LONG for a prompt that fills the context."""
        import torch

        model = self._require_loaded()
        max_tokens = self._checked_max_tokens(payload.max_tokens)
        stops = _checked_stops(payload.stop)
        arguments = sampling_arguments(payload.sampling)
        inputs = self._prompt_inputs(payload)
        prompt_ids = inputs["input_ids"]
        prompt_tokens = int(prompt_ids.shape[1])
        budget = self._token_budget(payload, prompt_tokens=prompt_tokens, max_tokens=max_tokens)

        context = [int(token) for token in prompt_ids[0, -_DECODE_CONTEXT_TOKENS:].tolist()]
        decode = self._decoder(context)
        text = TextStream(stops)
        cancelled = False

        def after_token(ids: Any) -> bool:
            nonlocal cancelled
            generated = ids[0, prompt_tokens:].tolist()
            step = text.advance(decode(generated))
            if step.delta and on_text is not None:
                on_text(step.delta, len(generated))
            if between_tokens is not None and between_tokens():
                cancelled = True
            return step.stopped or cancelled

        with torch.inference_mode(), _seeded(payload.sampling, model.device, arguments):
            output = model.generate(
                **inputs,
                max_new_tokens=budget,
                stopping_criteria=_each_token(after_token),
                **arguments,
            )
        generated = [int(token) for token in output[0, prompt_tokens:].tolist()]
        last = text.finish(decode(generated))
        if last and on_text is not None and not cancelled:
            on_text(last, len(generated))
        return worker_gateway_pb2.GenerateResult(
            text=text.sent,
            finish_reason=self._finish_reason(
                cancelled=cancelled, stopped=text.stopped, generated=generated
            ),
            prompt_tokens=prompt_tokens,
            completion_tokens=len(generated),
        )

    def _token_budget(
        self, payload: worker_gateway_pb2.GeneratePayload, *, prompt_tokens: int, max_tokens: int
    ) -> int:
        """The new tokens this prompt may get: `max_tokens`, less where the context ends first.
        INPUT_TOO_LONG for a prompt that leaves the context no room for one."""
        if not self._context_length:
            return max_tokens
        room = self._context_length - prompt_tokens
        if room <= 0:
            field = "messages" if payload.messages else "prompt"
            raise GantryError(
                "INPUT_TOO_LONG",
                f"{field} is {prompt_tokens} tokens long; the model's context holds "
                f"{self._context_length} with room for at least one new token",
                field=field,
                tokens=str(prompt_tokens),
                limit=str(self._context_length - 1),
            )
        return min(max_tokens, room)

    def _finish_reason(
        self, *, cancelled: bool, stopped: bool, generated: Sequence[int]
    ) -> common_pb2.FinishReason:
        """Why a generation ended: cancelled, a stop sequence or an end token, else its length."""
        if cancelled:
            return FINISH_CANCELLED
        if stopped or (generated and generated[-1] in self._end_ids):
            return FINISH_STOP
        return FINISH_LENGTH  # max_tokens, or the context's end

    def _checked_max_tokens(self, asked: int) -> int:
        if asked > self._max_new_tokens:
            raise GantryError(
                "INVALID_PAYLOAD",
                f"max_tokens {asked} is past this deployment's limit of {self._max_new_tokens} "
                "new tokens",
                field="max_tokens",
                limit=str(self._max_new_tokens),
                value=str(asked),
            )
        return asked or min(DEFAULT_MAX_TOKENS, self._max_new_tokens)

    def _prompt_inputs(self, payload: worker_gateway_pb2.GeneratePayload) -> Any:
        """The model's inputs (input_ids, attention_mask) for the prompt or the rendered chat."""
        model = self._require_loaded()
        tokenizer = self._tokenizer
        if payload.prompt and payload.messages:
            raise GantryError(
                "INVALID_PAYLOAD",
                "a generate request takes a prompt or messages, not both",
                field="messages",
            )
        if payload.messages:
            if not self.has_chat_template:
                raise GantryError(
                    "INVALID_PAYLOAD",
                    f"this model has no chat template, so it cannot render messages; send a "
                    f"prompt instead (adapter {self.name!r})",
                    field="messages",
                )
            messages = [
                {"role": message.role, "content": message.content} for message in payload.messages
            ]
            try:
                # The template writes the special tokens itself: none are added again.
                inputs = tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"
                )
            except Exception as exc:  # jinja2's TemplateError, or the template's own refusal
                raise GantryError(
                    "INVALID_PAYLOAD",
                    f"the model's chat template refused the messages: {exc}",
                    field="messages",
                ) from exc
        elif payload.prompt:
            inputs = tokenizer(payload.prompt, return_tensors="pt")
        else:
            raise GantryError(
                "INVALID_PAYLOAD", "a generate request needs a prompt or messages", field="prompt"
            )
        return _on_device(inputs, model.device)

    def _decoder(self, context: Sequence[int]) -> Callable[[Sequence[int]], str]:
        """Decoding of new ids after `context` (the prompt's last tokens), context text cut off."""
        tokenizer = self._tokenizer

        def text_of(ids: Sequence[int]) -> str:
            return str(
                tokenizer.decode(
                    list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False
                )
            )

        prefix = text_of(context)

        def decode(generated: Sequence[int]) -> str:
            decoded = text_of([*context, *generated])
            if decoded.startswith(prefix):
                return decoded[len(prefix) :]
            return text_of(generated)  # the context's text did not survive: decode alone

        return decode

    # -- health ---------------------------------------------------------------------------------

    def health_check(self) -> ForwardCheck:
        """The probe text through the model (finite logits, one row of the vocabulary's width per
        token) and a greedy generation of a few tokens, each in the vocabulary."""
        import torch

        started = time.monotonic()
        model = self._require_loaded()
        inputs = _on_device(self._tokenizer(HEALTH_PROBE_TEXT, return_tensors="pt"), model.device)
        input_ids = inputs["input_ids"]
        with torch.inference_mode():
            logits = model(**inputs).logits
            output = model.generate(**inputs, max_new_tokens=PROBE_NEW_TOKENS, do_sample=False)
        scores = logits.float().cpu().numpy()
        vocabulary = int(getattr(model.config, "vocab_size", 0) or 0)
        new_ids = [int(token) for token in output[0, input_ids.shape[1] :].tolist()]
        check = check_output(
            scores,
            expected_shape=(1, int(input_ids.shape[1]), vocabulary),
            seconds=time.monotonic() - started,
            healthy=(
                f"logits {tuple(scores.shape)} finite; {len(new_ids)} generated ids, all in the "
                "vocabulary"
            ),
        )
        width = int(scores.shape[-1])
        problem = None
        if not new_ids:
            problem = "probe generated no ids"
        elif not all(0 <= token < width for token in new_ids):
            problem = f"probe generated ids outside the vocabulary of {width}"
        if check.ok and problem:
            return check.failed(problem)
        return check

    def worst_case_check(self) -> tuple[ForwardCheck, WorstCase]:
        """One generation (the host runs each alone) whose prompt fills the context but for the
        tokens it then generates, every one of them forced (no early end token)."""
        import torch

        model = self._require_loaded()
        context = self._context_length or UNDECLARED_LENGTH_PROBED
        why = (
            f"the context of {context} tokens"
            if self._context_length
            else "no declared context length"
        )
        if not self.uses_cuda and context > CPU_WORST_CASE_CONTEXT:
            why = f"{why}, bounded to {CPU_WORST_CASE_CONTEXT} on the CPU"
            context = CPU_WORST_CASE_CONTEXT
        generated = max(1, min(self._max_new_tokens, WORST_CASE_NEW_TOKENS, context - 1))
        prompt = context - generated
        [token, *_] = self._tokenizer(WORST_CASE_WORD, add_special_tokens=False)["input_ids"]
        input_ids = torch.full((1, prompt), int(token), dtype=torch.long, device=model.device)
        started = time.monotonic()
        with torch.inference_mode():
            output = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=generated,
                min_new_tokens=generated,
                do_sample=False,
            )
        ids = output.float().cpu().numpy()
        check = check_output(
            ids,
            expected_shape=(1, context),
            seconds=time.monotonic() - started,
            healthy=f"{generated} tokens generated after a prompt of {prompt}",
        )
        worst = WorstCase(
            batch_inputs=1,
            input_tokens=prompt,
            generated_tokens=generated,
            context_tokens=int(output.shape[1]),
            detail=f"one prompt of {prompt} tokens generating {generated}: {why}",
        )
        return check, worst


def _on_device(encoded: Any, device: Any) -> dict[str, Any]:
    """The model's inputs from a tokenizer's output: the ids, and the attention mask when the
    tokenizer gives one (token type ids and the like are not a causal LM's)."""
    inputs = {"input_ids": encoded["input_ids"].to(device)}
    if encoded.get("attention_mask") is not None:
        inputs["attention_mask"] = encoded["attention_mask"].to(device)
    return inputs


def _checked_stops(stops: Sequence[str]) -> list[str]:
    for index, stop in enumerate(stops):
        if not stop:
            raise GantryError("INVALID_PAYLOAD", f"stop[{index}] is empty", field=f"stop[{index}]")
    return list(stops)


def _each_token(after_token: Callable[[Any], bool]) -> Any:
    """`generate`'s stopping criteria: `after_token(ids)` after every token, True to stop."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class AfterEachToken(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            stop = after_token(input_ids)
            return torch.full(
                (input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device
            )

    return StoppingCriteriaList([AfterEachToken()])


@contextlib.contextmanager
def _seeded(
    sampling: common_pb2.SamplingSettings, device: Any, arguments: dict[str, Any]
) -> Iterator[None]:
    """A sampled generation with a seed draws from a forked, seeded RNG state."""
    import torch

    if not arguments.get("do_sample") or not sampling.seed:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(sampling.seed)
        yield

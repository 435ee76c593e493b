"""A generation's answer from a worker, checked before the work counts as finished. Pure.

A result the control plane refuses is INVOKE_FAILED (class INFRA): it counts against the residency
that gave it, in the scheduler and the breakers, never as a success, and the client never reads
it as an answer. A generation ends for a reason (STOP or LENGTH; CANCELLED is what a host answers
a call nobody waits for any more), produces at most the tokens it was allowed, reads at least one
prompt token, and says it produced no tokens only with no text. Streamed, its deltas add up to its
whole text.
"""

from __future__ import annotations

from collections.abc import Sequence

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg

ANSWERED_FINISH_REASONS = (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH)


def checked_generation_result(result: wg.GenerateResult, *, max_tokens: int) -> wg.GenerateResult:
    """`result` when it is a possible answer to a call allowed `max_tokens` new tokens."""
    if result.finish_reason not in ANSWERED_FINISH_REASONS:
        name = common_pb2.FinishReason.Name(result.finish_reason) if _known(result) else "unknown"
        raise GantryError(
            "INVOKE_FAILED",
            f"the worker ended a generation with finish reason {name} ({result.finish_reason})",
        )
    if result.completion_tokens > max_tokens:
        raise GantryError(
            "INVOKE_FAILED",
            f"the worker produced {result.completion_tokens} tokens for a call allowed "
            f"{max_tokens}",
        )
    if result.prompt_tokens == 0:
        raise GantryError("INVOKE_FAILED", "the worker generated from a prompt of 0 tokens")
    if result.text and result.completion_tokens == 0:
        raise GantryError("INVOKE_FAILED", "the worker returned text from 0 generated tokens")
    return result


def checked_stream_result(
    result: wg.GenerateResult, streamed: Sequence[str], *, max_tokens: int
) -> wg.GenerateResult:
    """As checked_generation_result, and the text streamed before it is its whole text: a client
    that joins the chunks reads what Generate would have answered."""
    checked = checked_generation_result(result, max_tokens=max_tokens)
    joined = "".join(streamed)
    if joined != checked.text:
        raise GantryError(
            "INVOKE_FAILED",
            f"the worker streamed {len(joined)} characters of text but answered "
            f"{len(checked.text)} as the whole",
        )
    return checked


def checked_delta(progress: wg.InvokeProgress) -> wg.GenerateDelta:
    """The text of one progress item of a streaming generation; any other kind is INVOKE_FAILED
    (an unknown variant is an error, never skipped)."""
    kind = progress.WhichOneof("progress")
    if kind != "generate":
        raise GantryError(
            "INVOKE_FAILED", f"the worker sent {kind or 'empty'!r} progress for a generation"
        )
    return progress.generate


def _known(result: wg.GenerateResult) -> bool:
    return result.finish_reason in common_pb2.FinishReason.values()

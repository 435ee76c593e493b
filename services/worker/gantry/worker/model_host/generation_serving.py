"""The model host's generate requests: text for a prompt or chat, streamed when asked, cancellable.

A generation runs alone, never batched, on the serving loop's thread. With `stream` set, each
settled piece of text goes out as a `generate_delta` frame (same request_id) while the tokens are
produced, and the final `generate` answer carries the whole text, which the deltas join to. After
every token the reader thread's record of `CancelRequest`s is consulted: a cancelled generation
stops there and is not answered (the parent stopped listening when it cancelled). One span,
`model_host.generate`, with the payload's shape and, once done, the token counts and why it ended.
"""

from __future__ import annotations

import logging
import time

from opentelemetry import trace

from gantry.common.telemetry import extract_context
from gantry.v1 import common_pb2, model_host_pb2, worker_gateway_pb2
from gantry.worker.model_host.adapters import ModelAdapter
from gantry.worker.model_host.inbox import Inbox, ResponseWriter
from gantry.worker.model_host.media_serving import FailForwardPass, RequestRunner

logger = logging.getLogger("gantry.model_host")

GENERATE_KIND = "generate"

# Test hook, on only in hosts a test starts with `HostLaunchSpec(test_hooks=True)`: a prompt equal
# to this one takes TEST_HOOK_SLOW_TOKEN_S per token, so a test can cancel a generation long
# before it would end.
TEST_HOOK_SLOW_TOKENS_PROMPT = "__gantry_test_hook__:slow-tokens"
TEST_HOOK_SLOW_TOKEN_S = 0.05


class GenerateRequests(RequestRunner):
    """Runs one generate request on the adapter and answers it (or, cancelled, does not)."""

    def __init__(
        self,
        *,
        adapter: ModelAdapter,
        inbox: Inbox,
        responses: ResponseWriter,
        tracer: trace.Tracer,
        fail: FailForwardPass,
        test_hooks: bool,
    ) -> None:
        super().__init__(adapter=adapter, responses=responses, tracer=tracer, fail=fail)
        self._inbox = inbox
        self._test_hooks = test_hooks

    def run(self, request: model_host_pb2.HostRequest) -> None:
        payload = request.generate
        request_id = request.request_id
        span = self._tracer.start_span(
            "model_host.generate",
            context=extract_context(request.trace_context),
            attributes={
                "gantry.stream": payload.stream,
                "gantry.max_tokens": payload.max_tokens,
                "gantry.prompt_chars": len(payload.prompt),
                "gantry.message_count": len(payload.messages),
                "gantry.stop_count": len(payload.stop),
            },
        )
        slow = self._test_hooks and payload.prompt == TEST_HOOK_SLOW_TOKENS_PROMPT
        if slow:
            logger.warning("test hook: %g s per generated token", TEST_HOOK_SLOW_TOKEN_S)

        def between_tokens() -> bool:
            if slow:
                time.sleep(TEST_HOOK_SLOW_TOKEN_S)
            return self._inbox.take_cancelled(request_id)

        def send_delta(text: str, completion_tokens: int) -> None:
            delta = worker_gateway_pb2.GenerateDelta(text=text, completion_tokens=completion_tokens)
            self._responses.send(
                model_host_pb2.HostResponse(request_id=request_id, generate_delta=delta)
            )

        result = self._forward(
            request,
            span,
            lambda: self._adapter.generate_text(
                payload,
                on_text=send_delta if payload.stream else None,
                between_tokens=between_tokens,
            ),
        )
        if result is None:
            return
        span.set_attributes(
            {
                "gantry.prompt_tokens": result.prompt_tokens,
                "gantry.completion_tokens": result.completion_tokens,
                "gantry.finish_reason": common_pb2.FinishReason.Name(result.finish_reason),
            }
        )
        span.end()
        if result.finish_reason == common_pb2.FINISH_REASON_CANCELLED:
            logger.info(
                "generate request %d cancelled after %d tokens; not answered",
                request_id,
                result.completion_tokens,
            )
            return
        self._responses.send(model_host_pb2.HostResponse(request_id=request_id, generate=result))

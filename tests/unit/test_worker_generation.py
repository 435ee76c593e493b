"""The worker's side of a generation: the model host's answer is checked (why it ended, counts that
can be, the streamed deltas joining to its text) before anything trusts it, and Invocations sends
a streamed generation's deltas as InvokeProgress, in order, before its one InvokeResult, carrying
a delta the outbox refused into the next one; a cancelled generation sends no result."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2, model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.invocations import Invocations
from gantry.worker.model_host.host_answers import StreamedDeltas, checked_generate

STOP = common_pb2.FINISH_REASON_STOP
LENGTH = common_pb2.FINISH_REASON_LENGTH


def _answer(**fields: Any) -> model_host_pb2.HostResponse:
    values = {"text": "ab", "finish_reason": STOP, "prompt_tokens": 3, "completion_tokens": 2}
    return model_host_pb2.HostResponse(generate=wg.GenerateResult(**{**values, **fields}))


def _delta(text: str, tokens: int) -> model_host_pb2.HostResponse:
    return model_host_pb2.HostResponse(
        generate_delta=wg.GenerateDelta(text=text, completion_tokens=tokens)
    )


def _streamed(*deltas: model_host_pb2.HostResponse, stream: bool = True) -> StreamedDeltas:
    received = StreamedDeltas(stream=stream, forward=None)
    for delta in deltas:
        received.receive(delta)
    return received


def test_a_streamed_answer_whose_text_is_its_deltas_joined_is_taken() -> None:
    forwarded: list[wg.GenerateDelta] = []
    deltas = StreamedDeltas(stream=True, forward=forwarded.append)
    deltas.receive(_delta("a", 1))
    deltas.receive(_delta("b", 2))
    result = checked_generate(_answer(), max_tokens=8, deltas=deltas)
    assert result.text == "ab"
    assert [delta.text for delta in forwarded] == ["a", "b"]


@pytest.mark.parametrize(
    ("answer", "deltas", "max_tokens", "why"),
    [
        (_answer(finish_reason=common_pb2.FINISH_REASON_UNSPECIFIED), _streamed(), 8, "reason"),
        (_answer(finish_reason=common_pb2.FINISH_REASON_CANCELLED), _streamed(), 8, "reason"),
        (_answer(completion_tokens=9), _streamed(), 8, "completion tokens"),
        (_answer(prompt_tokens=0), _streamed(), 8, "0 prompt"),
        (_answer(completion_tokens=0), _streamed(), 8, "0 completion"),
        (_answer(), _streamed(_delta("a", 1), _delta("c", 2)), 8, "not them joined"),
        (_answer(), _streamed(_delta("a", 2), _delta("b", 1)), 8, "after one at 2"),
        (_answer(), _streamed(_delta("ab", 2), stream=False), 8, "did not ask"),
        (_answer(completion_tokens=1), _streamed(_delta("ab", 2)), 8, "2 tokens streamed"),
    ],
)
def test_an_answer_that_cannot_be_is_invoke_failed(
    answer: model_host_pb2.HostResponse, deltas: StreamedDeltas, max_tokens: int, why: str
) -> None:
    with pytest.raises(GantryError) as caught:
        checked_generate(answer, max_tokens=max_tokens, deltas=deltas)
    assert caught.value.reason == "INVOKE_FAILED"
    assert why in caught.value.message


def test_the_hosts_refusal_is_raised_as_it_is() -> None:
    refusal = GantryError("INVALID_PAYLOAD", "max_tokens 9 is past", field="max_tokens")
    response = model_host_pb2.HostResponse(failure=refusal.to_failure())
    with pytest.raises(GantryError) as caught:
        checked_generate(response, max_tokens=9, deltas=_streamed())
    assert (caught.value.reason, caught.value.metadata) == ("INVALID_PAYLOAD", refusal.metadata)


class FakeGeneratingHost:
    """Streams fixed deltas (each after a turn of the loop), then answers, or hangs until
    cancelled when `hang` is set."""

    def __init__(self, pieces: list[str], *, hang: bool = False) -> None:
        self.pieces = pieces
        self.hang = hang
        self.cancelled = asyncio.Event()
        self.streaming = asyncio.Event()

    async def invoke(
        self,
        kind: str,
        payload: wg.GeneratePayload,
        *,
        trace_context: object,
        timeout_s: float,
        on_delta: Callable[[wg.GenerateDelta], None] | None = None,
    ) -> wg.GenerateResult:
        assert kind == "generate"
        for tokens, piece in enumerate(self.pieces, start=1):
            if payload.stream and on_delta is not None:
                on_delta(wg.GenerateDelta(text=piece, completion_tokens=tokens))
            self.streaming.set()
            await asyncio.sleep(0)
        if self.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return wg.GenerateResult(
            text="".join(self.pieces),
            finish_reason=LENGTH,
            prompt_tokens=2,
            completion_tokens=len(self.pieces),
        )


class FakeSupervisor:
    def __init__(self, host: FakeGeneratingHost) -> None:
        self.host = host

    def host_for_invoke(self, deployment_id: str) -> FakeGeneratingHost:
        return self.host


class Outbox:
    """The agent's outbox as Invocations sees it: everything in order, refusing when full."""

    def __init__(self) -> None:
        self.messages: list[wg.InvokeProgress | wg.InvokeResult] = []
        self.full = False
        self.answered = asyncio.Event()

    def emit(self, result: wg.InvokeResult) -> None:
        self.messages.append(result)
        self.answered.set()

    def emit_progress(self, progress: wg.InvokeProgress) -> bool:
        if self.full:
            return False
        self.messages.append(progress)
        return True


def _invoke(request_id: str, *, stream: bool) -> wg.Invoke:
    invoke = wg.Invoke(
        request_id=request_id,
        deployment_id="dep",
        generate=wg.GeneratePayload(prompt="hi", max_tokens=8, stream=stream),
    )
    invoke.timeout.FromSeconds(5)
    return invoke


def _invocations(host: FakeGeneratingHost, outbox: Outbox) -> Invocations:
    return Invocations(
        supervisor=FakeSupervisor(host),  # type: ignore[arg-type]
        emit=outbox.emit,
        emit_progress=outbox.emit_progress,
    )


def _texts(messages: list[wg.InvokeProgress | wg.InvokeResult]) -> list[str]:
    return [m.generate.text for m in messages if isinstance(m, wg.InvokeProgress)]


async def test_a_streamed_generation_sends_its_deltas_in_order_then_one_result() -> None:
    outbox = Outbox()
    _invocations(FakeGeneratingHost(["Hel", "lo", "!"]), outbox).start(
        _invoke("r1", stream=True), {}
    )
    await asyncio.wait_for(outbox.answered.wait(), timeout=5)
    *progress, result = outbox.messages
    assert [type(message) for message in progress] == [wg.InvokeProgress] * 3
    assert _texts(outbox.messages) == ["Hel", "lo", "!"]
    assert [p.generate.completion_tokens for p in progress] == [1, 2, 3]  # type: ignore[union-attr]
    assert {message.request_id for message in outbox.messages} == {"r1"}
    assert isinstance(result, wg.InvokeResult) and result.generate.text == "Hello!"


async def test_a_generation_not_streamed_sends_its_result_alone() -> None:
    outbox = Outbox()
    _invocations(FakeGeneratingHost(["Hel", "lo"]), outbox).start(_invoke("r2", stream=False), {})
    await asyncio.wait_for(outbox.answered.wait(), timeout=5)
    assert [type(message) for message in outbox.messages] == [wg.InvokeResult]


async def test_deltas_the_outbox_refuses_are_carried_into_the_next_and_none_is_lost() -> None:
    outbox = Outbox()
    outbox.full = True
    host = FakeGeneratingHost(["a", "b", "c", "d"])
    original = host.invoke

    async def generate_freeing_the_outbox(*args: Any, **kwargs: Any) -> wg.GenerateResult:
        on_delta = kwargs["on_delta"]

        def on_delta_then_free(delta: wg.GenerateDelta) -> None:
            on_delta(delta)
            outbox.full = False  # "a" was refused: it goes with "b"

        kwargs["on_delta"] = on_delta_then_free
        return await original(*args, **kwargs)

    host.invoke = generate_freeing_the_outbox  # type: ignore[method-assign]
    _invocations(host, outbox).start(_invoke("r3", stream=True), {})
    await asyncio.wait_for(outbox.answered.wait(), timeout=5)
    assert _texts(outbox.messages) == ["ab", "c", "d"]
    assert isinstance(outbox.messages[-1], wg.InvokeResult)


async def test_what_the_outbox_still_holds_back_goes_out_before_the_result() -> None:
    outbox = Outbox()
    host = FakeGeneratingHost(["a", "b"])
    original = host.invoke

    async def generate_then_free(*args: Any, **kwargs: Any) -> wg.GenerateResult:
        outbox.full = True
        result = await original(*args, **kwargs)
        outbox.full = False
        return result

    host.invoke = generate_then_free  # type: ignore[method-assign]
    _invocations(host, outbox).start(_invoke("r4", stream=True), {})
    await asyncio.wait_for(outbox.answered.wait(), timeout=5)
    assert _texts(outbox.messages) == ["ab"]
    assert isinstance(outbox.messages[-1], wg.InvokeResult)


async def test_a_cancelled_generation_stops_in_the_host_and_sends_no_result() -> None:
    outbox = Outbox()
    host = FakeGeneratingHost(["a"], hang=True)
    invocations = _invocations(host, outbox)
    invocations.start(_invoke("r5", stream=True), {})
    await asyncio.wait_for(host.streaming.wait(), timeout=5)
    assert invocations.cancel("r5")
    await asyncio.wait_for(host.cancelled.wait(), timeout=5)
    await invocations.close()
    assert [type(message) for message in outbox.messages] == [wg.InvokeProgress]
    assert len(invocations) == 0

"""`make bench`'s c=1 timing (tests/bench/timing.timed_blocks): every timed call follows a call
of its own kind, never the other's, and each kind gets the number of samples asked for."""

from __future__ import annotations

import asyncio

from tests.bench.timing import timed_blocks


def test_each_timed_call_follows_one_of_its_own_kind() -> None:
    order: list[str] = []
    timed: list[tuple[str, str]] = []  # (kind, kind of the call before it)

    def kind_call(kind: str):  # a bench Call
        async def call() -> float:
            before = order[-1] if order else ""
            order.append(kind)
            timed.append((kind, before))
            return float(len(order))  # its "own measure": the call's place in the sequence

        return call

    samples = asyncio.run(timed_blocks([kind_call("a"), kind_call("b")], 25, block=10))

    assert [len(s) for s in samples] == [25, 25]
    # The samples are the calls' own measures: their places in the sequence. Each place's
    # predecessor is of the same kind.
    for kind, measured in zip("ab", samples, strict=True):
        for place in measured:
            index = int(place) - 1
            assert order[index] == kind
            assert order[index - 1] == kind


def test_blocks_alternate_so_noise_weighs_on_both() -> None:
    order: list[str] = []

    def kind_call(kind: str):  # a bench Call
        async def call() -> float:
            order.append(kind)
            return 0.0

        return call

    asyncio.run(timed_blocks([kind_call("a"), kind_call("b")], 30, block=10))
    after_warmup = "".join(order)[10:]  # 5 warm-up rounds of one call each
    runs = [after_warmup[0]]
    for kind in after_warmup[1:]:
        if kind != runs[-1][-1]:
            runs.append(kind)
        else:
            runs[-1] += kind
    assert [len(run) for run in runs] == [11] * 6  # one untimed + 10 timed, three blocks each
    assert "".join(run[0] for run in runs) == "ababab"

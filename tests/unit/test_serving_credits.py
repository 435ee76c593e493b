"""The control plane's credits (serving/credits.py): taken one call at a time, kept after a call
that did not fail for the infrastructure, returned once revoked, void once their stream ended."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gantry.controlplane.serving.credits import (
    MAX_HELD_REPORTS,
    REPORT_DELAY_S,
    CreditPool,
    keeps,
)
from gantry.v1 import scheduler_pb2

SUCCESS = scheduler_pb2.WORK_OUTCOME_SUCCESS
INFRA = scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE


@dataclass
class Link:
    epoch: int = 1
    connected: bool = True
    sent: list[tuple[str, ...]] = field(default_factory=list)
    listener: object = None

    def listen_credits(self, listener: object) -> None:
        self.listener = listener

    def work_finished(
        self, work_id: str, outcome: int, *, reason: str = "", credit_id: str = "", cost: int = 0
    ) -> None:
        self.sent.append(("finished", work_id, credit_id, str(cost)))

    def credits_returned(self, credit_ids: Sequence[str]) -> None:
        self.sent.append(("returned", *credit_ids))


@dataclass
class Timers:
    """The pool's call_later, run by hand: what is due, and whether it was cancelled."""

    due: list[tuple[float, Callable[[], None]]] = field(default_factory=list)
    cancelled: int = 0

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timers:
        self.due.append((delay, callback))
        return self

    def cancel(self) -> None:
        self.cancelled += 1
        self.due.clear()

    def fire(self) -> None:
        due, self.due = self.due, []
        for _, callback in due:
            callback()


def grant(credit_id: str, *, slots: int = 1, tenant: str = "t1") -> scheduler_pb2.CreditGranted:
    return scheduler_pb2.CreditGranted(
        credit_id=credit_id,
        deployment_id="d1",
        tenant_id=tenant,
        residency_id="r1",
        node_id="n1",
        slots=slots,
    )


def pool_with(
    *grants: scheduler_pb2.CreditGranted, timers: Timers | None = None
) -> tuple[CreditPool, Link]:
    link = Link()
    pool = CreditPool(link, call_later=(timers or Timers()).call_later)
    assert link.listener is pool
    for g in grants:
        pool.granted(g, link.epoch)
    return pool, link


def test_a_credit_carries_one_call_at_a_time_and_is_kept_after_a_success() -> None:
    timers = Timers()
    pool, link = pool_with(grant("c1", slots=2), timers=timers)
    assert pool.take("d1", "t2", 1) is None  # another tenant's pair
    assert pool.take("d1", "t1", 3) is None  # more inputs than its slots
    credit = pool.take("d1", "t1", 2)
    assert credit is not None and credit.node_id == "n1"
    assert pool.take("d1", "t1", 1) is None  # busy
    pool.finish(credit, "w1", SUCCESS, reason="", cost=12)
    # Kept: the credit serves the next call at once; its report waits for company.
    assert pool.take("d1", "t1", 1) is credit
    assert link.sent == [] and [delay for delay, _ in timers.due] == [REPORT_DELAY_S]
    pool.finish(credit, "w2", scheduler_pb2.WORK_OUTCOME_REQUEST_FAILURE, reason="X", cost=3)
    assert len(timers.due) == 1  # one timer for whatever waits
    timers.fire()
    assert link.sent == [("finished", "w1", "c1", "12"), ("finished", "w2", "c1", "3")]
    timers.fire()
    assert len(link.sent) == 2  # sent once


def test_held_reports_go_at_the_bound_without_waiting_for_the_timer() -> None:
    timers = Timers()
    pool, link = pool_with(grant("c1"), timers=timers)
    for i in range(MAX_HELD_REPORTS):
        credit = pool.take("d1", "t1", 1)
        assert credit is not None
        pool.finish(credit, f"w{i}", SUCCESS, reason="", cost=1)
    assert [sent[1] for sent in link.sent] == [f"w{i}" for i in range(MAX_HELD_REPORTS)]
    assert timers.due == [] and timers.cancelled == 1


def test_an_infra_failure_reports_then_returns_the_credit() -> None:
    pool, link = pool_with(grant("c1"))
    credit = pool.take("d1", "t1", 1)
    assert credit is not None
    pool.finish(credit, "w0", SUCCESS, reason="", cost=2)  # held
    credit = pool.take("d1", "t1", 1)
    assert credit is not None
    pool.finish(credit, "w1", INFRA, reason="RUNTIME_CRASHED", cost=1)
    # At once, after the held report: the breakers read them in the order the calls ended.
    assert link.sent == [
        ("finished", "w0", "c1", "2"),
        ("finished", "w1", "c1", "1"),
        ("returned", "c1"),
    ]
    assert pool.take("d1", "t1", 1) is None and len(pool) == 0


def test_a_revoke_returns_idle_credits_at_once_and_busy_ones_after_their_call() -> None:
    pool, link = pool_with(grant("c1"), grant("c2"))
    busy = pool.take("d1", "t1", 1)
    assert busy is not None
    idle_id = "c2" if busy.credit_id == "c1" else "c1"
    served = pool.take("d1", "t1", 1)
    assert served is not None and served.credit_id == idle_id
    pool.finish(served, "w0", SUCCESS, reason="", cost=1)  # held
    pool.revoked(["c1", "c2", "unknown"])
    # What the credits served goes before they come back.
    assert link.sent == [("finished", "w0", idle_id, "1"), ("returned", idle_id)]
    link.sent.clear()
    assert pool.take("d1", "t1", 1) is None  # never used again
    pool.finish(busy, "w1", SUCCESS, reason="", cost=1)
    assert link.sent == [("finished", "w1", busy.credit_id, "1"), ("returned", busy.credit_id)]
    assert len(pool) == 0


def test_credits_of_an_ended_stream_are_void_and_their_calls_unreported() -> None:
    timers = Timers()
    pool, link = pool_with(grant("c1"), grant("c2"), timers=timers)
    ended = pool.take("d1", "t1", 1)
    assert ended is not None
    pool.finish(ended, "w0", SUCCESS, reason="", cost=1)  # held when the stream ends
    busy = pool.take("d1", "t1", 1)
    assert busy is not None
    link.epoch = 2  # a new stream: the scheduler took the old one's credits back
    assert pool.take("d1", "t1", 1) is None
    pool.lost()
    pool.finish(busy, "w1", SUCCESS, reason="", cost=1)
    timers.fire()
    assert link.sent == [] and timers.cancelled == 1
    # A new grant on the new stream with an id the old one used is its own credit.
    pool.granted(grant("c1"), link.epoch)
    assert pool.take("d1", "t1", 1) is not None


def test_no_credit_is_taken_while_the_link_takes_no_requests() -> None:
    pool, link = pool_with(grant("c1"))
    link.connected = False
    assert pool.take("d1", "t1", 1) is None


def test_keeps() -> None:
    assert keeps(SUCCESS, revoked=False)
    assert keeps(scheduler_pb2.WORK_OUTCOME_REQUEST_FAILURE, revoked=False)
    # A call cut short may be this replica holding no stream to the node: the queue decides next.
    assert not keeps(scheduler_pb2.WORK_OUTCOME_CANCELLED, revoked=False)
    assert not keeps(INFRA, revoked=False)
    assert not keeps(SUCCESS, revoked=True)


def test_a_link_without_credits_gets_no_pool() -> None:
    assert CreditPool.attach(object()) is None

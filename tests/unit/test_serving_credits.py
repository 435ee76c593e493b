"""The control plane's credits (serving/credits.py): taken one call at a time, kept after a call
that did not fail for the infrastructure, returned once revoked, void once their stream ended."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gantry.controlplane.serving.credits import CreditPool, keeps
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


def grant(credit_id: str, *, slots: int = 1, tenant: str = "t1") -> scheduler_pb2.CreditGranted:
    return scheduler_pb2.CreditGranted(
        credit_id=credit_id,
        deployment_id="d1",
        tenant_id=tenant,
        residency_id="r1",
        node_id="n1",
        slots=slots,
    )


def pool_with(*grants: scheduler_pb2.CreditGranted) -> tuple[CreditPool, Link]:
    link = Link()
    pool = CreditPool(link)
    assert link.listener is pool
    for g in grants:
        pool.granted(g, link.epoch)
    return pool, link


def test_a_credit_carries_one_call_at_a_time_and_is_kept_after_a_success() -> None:
    pool, link = pool_with(grant("c1", slots=2))
    assert pool.take("d1", "t2", 1) is None  # another tenant's pair
    assert pool.take("d1", "t1", 3) is None  # more inputs than its slots
    credit = pool.take("d1", "t1", 2)
    assert credit is not None and credit.node_id == "n1"
    assert pool.take("d1", "t1", 1) is None  # busy
    pool.finish(credit, "w1", SUCCESS, reason="", cost=12)
    assert link.sent == [("finished", "w1", "c1", "12")]
    assert pool.take("d1", "t1", 1) is credit


def test_an_infra_failure_reports_then_returns_the_credit() -> None:
    pool, link = pool_with(grant("c1"))
    credit = pool.take("d1", "t1", 1)
    assert credit is not None
    pool.finish(credit, "w1", INFRA, reason="RUNTIME_CRASHED", cost=1)
    assert link.sent == [("finished", "w1", "c1", "1"), ("returned", "c1")]
    assert pool.take("d1", "t1", 1) is None and len(pool) == 0


def test_a_revoke_returns_idle_credits_at_once_and_busy_ones_after_their_call() -> None:
    pool, link = pool_with(grant("c1"), grant("c2"))
    busy = pool.take("d1", "t1", 1)
    assert busy is not None
    pool.revoked(["c1", "c2", "unknown"])
    idle_id = "c2" if busy.credit_id == "c1" else "c1"
    assert link.sent == [("returned", idle_id)]
    assert pool.take("d1", "t1", 1) is None  # never used again
    pool.finish(busy, "w1", SUCCESS, reason="", cost=1)
    assert link.sent[1:] == [("finished", "w1", busy.credit_id, "1"), ("returned", busy.credit_id)]
    assert len(pool) == 0


def test_credits_of_an_ended_stream_are_void_and_their_calls_unreported() -> None:
    pool, link = pool_with(grant("c1"), grant("c2"))
    busy = pool.take("d1", "t1", 1)
    assert busy is not None
    link.epoch = 2  # a new stream: the scheduler took the old one's credits back
    assert pool.take("d1", "t1", 1) is None
    pool.lost()
    pool.finish(busy, "w1", SUCCESS, reason="", cost=1)
    assert link.sent == []
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

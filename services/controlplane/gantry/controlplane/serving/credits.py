"""The credits this control plane holds: slots the scheduler leased to its stream ahead of need
(the scheduler's policy/credits.py), so an uncontended call goes control plane -> worker -> host
with no scheduler round trip before it goes.

A call takes an idle credit for its (deployment, tenant) with room for its inputs (`take`), is
dispatched to the credit's node, and afterwards (`finish`) is reported to the scheduler as
WorkFinished with the credit's id. A report of a call after which its credit is kept waits up to
`REPORT_DELAY_S` for others to go with it, all queued on the link's outbox at once and sent as
one batch: nobody waits for it (the credit keeps its slots, the call was answered), and a stream
message costs the scheduler and this loop once for many reports. Why (issue 29): at concurrency
1 every credited call's report went alone, and the scheduler spent 0.5 ms of CPU per call on
it. Any other report, a revoke and a return go at once, after the held ones, so the scheduler
reads every report before its credit comes back. Each credit carries a call at a time. It is
kept for the next call unless the scheduler revoked it meanwhile or the call did not get its
residency's answer (`keeps`): then it is returned (CreditsReturned) right after the report, so the
next call goes through the queue, where the breakers see it. A revoked credit that is idle is
returned at once and never taken again; one busy is returned when its call ends.

A credit is valid on the stream that granted it only: each carries that stream's epoch, a call is
never put on a credit of another epoch, and a report for one (its stream ended meanwhile, and the
scheduler took its credits back itself) is not sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.v1 import scheduler_pb2


@dataclass(slots=True, eq=False)
class HeldCredit:
    credit_id: str
    deployment_id: str
    tenant_id: str
    residency_id: str
    node_id: str
    slots: int  # inputs a call on it may have at most
    epoch: int  # the link's stream that granted it
    busy: bool = False
    revoked: bool = False


# Outcomes after which a credit serves the next call: its residency answered. Any other (an INFRA
# failure; a cancellation, which may be this replica holding no stream to the node) returns it,
# so the next call goes through the queue, where the breakers and the routing see it.
_KEPT_AFTER = frozenset(
    {scheduler_pb2.WORK_OUTCOME_SUCCESS, scheduler_pb2.WORK_OUTCOME_REQUEST_FAILURE}
)


# How long a kept credit's report may wait for company, and how many may wait: the scheduler's
# served counts (`gantry queue`) lag the calls by as much, its queue order and breakers never
# (a contention revokes, which sends what waits first; a failure returns its credit, the same).
REPORT_DELAY_S = 0.1
MAX_HELD_REPORTS = 64


class _Timer(Protocol):
    def cancel(self) -> None: ...


# (delay in seconds, callback) -> a handle that cancels it: the running loop's call_later.
CallLater = Callable[[float, Callable[[], None]], _Timer]


@dataclass(frozen=True, slots=True)
class _Report:
    work_id: str
    outcome: scheduler_pb2.WorkOutcome
    reason: str
    credit_id: str
    cost: int
    epoch: int


def keeps(outcome: scheduler_pb2.WorkOutcome, *, revoked: bool) -> bool:
    """Whether a credit serves the next call after one ended so (never once revoked)."""
    return not revoked and outcome in _KEPT_AFTER


class CreditPool:
    def __init__(self, link: SchedulerLink, *, call_later: CallLater | None = None) -> None:
        self._link = link
        self._held: dict[str, HeldCredit] = {}
        self._idle: dict[tuple[str, str], list[HeldCredit]] = {}  # (deployment, tenant) -> idle
        self._call_later = call_later
        self._reports: list[_Report] = []  # kept credits' reports waiting to go together
        self._flush_timer: _Timer | None = None
        link.listen_credits(self)

    @classmethod
    def attach(cls, link: object) -> CreditPool | None:
        """A pool on `link` if it takes credits (a test's stand-in link may not: no credits)."""
        return cls(link) if hasattr(link, "listen_credits") else None  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self._held)

    # ---- the link's listener ------------------------------------------------------------------

    def granted(self, grant: scheduler_pb2.CreditGranted, epoch: int) -> None:
        credit = HeldCredit(
            credit_id=grant.credit_id,
            deployment_id=grant.deployment_id,
            tenant_id=grant.tenant_id,
            residency_id=grant.residency_id,
            node_id=grant.node_id,
            slots=max(1, grant.slots),
            epoch=epoch,
        )
        self._held[credit.credit_id] = credit
        self._idle.setdefault((credit.deployment_id, credit.tenant_id), []).append(credit)

    def revoked(self, credit_ids: Sequence[str]) -> None:
        idle = []
        for credit_id in credit_ids:
            credit = self._held.get(credit_id)
            if credit is None:
                continue  # returned already (its call failed)
            credit.revoked = True
            if not credit.busy:
                self._forget(credit)
                idle.append(credit_id)
        # Contention: the scheduler reads what these credits served before any comes back.
        self.send_reports()
        if idle:
            self._link.credits_returned(idle)

    def lost(self) -> None:
        """The stream ended: the scheduler took every credit back; busy ones end unreported, and
        the reports still waiting are void (the scheduler no longer knows their credits)."""
        self._held.clear()
        self._idle.clear()
        self._reports.clear()
        self._stop_timer()

    # ---- calls --------------------------------------------------------------------------------

    def take(self, deployment_id: str, tenant_id: str, inputs: int) -> HeldCredit | None:
        """An idle credit for the call, now busy; None: the call goes through the queue."""
        if not self._link.connected:
            return None  # a silent scheduler: refused as before, nothing dispatched unheard
        idle = self._idle.get((deployment_id, tenant_id))
        if not idle:
            return None
        epoch = self._link.epoch
        for index, credit in enumerate(idle):
            if credit.epoch == epoch and credit.slots >= inputs:
                del idle[index]
                credit.busy = True
                return credit
        return None

    def finish(
        self,
        credit: HeldCredit,
        work_id: str,
        outcome: scheduler_pb2.WorkOutcome,
        *,
        reason: str,
        cost: int,
    ) -> None:
        """The call on `credit` ended: reported, and the credit kept or returned (`keeps`)."""
        credit.busy = False
        if credit.epoch != self._link.epoch or self._held.get(credit.credit_id) is not credit:
            return  # its stream ended: the scheduler reclaimed it and would not know the report
        report = _Report(work_id, outcome, reason, credit.credit_id, cost, credit.epoch)
        if keeps(outcome, revoked=credit.revoked):
            self._hold(report)
            self._idle.setdefault((credit.deployment_id, credit.tenant_id), []).append(credit)
        else:
            self.send_reports()
            self._send(report)
            self._forget(credit)
            self._link.credits_returned([credit.credit_id])

    def send_reports(self) -> None:
        """Queue the waiting reports on the link now, in the order their calls ended."""
        self._stop_timer()
        reports, self._reports = self._reports, []
        epoch = self._link.epoch
        for report in reports:
            if report.epoch == epoch:  # else its stream ended: void (`lost`)
                self._send(report)

    def _hold(self, report: _Report) -> None:
        self._reports.append(report)
        if len(self._reports) >= MAX_HELD_REPORTS:
            self.send_reports()
        elif self._flush_timer is None:
            call_later = self._call_later or asyncio.get_running_loop().call_later
            self._flush_timer = call_later(REPORT_DELAY_S, self._timer_fired)

    def _timer_fired(self) -> None:
        self._flush_timer = None
        self.send_reports()

    def _stop_timer(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None

    def _send(self, report: _Report) -> None:
        self._link.work_finished(
            report.work_id,
            report.outcome,
            reason=report.reason,
            credit_id=report.credit_id,
            cost=report.cost,
        )

    def _forget(self, credit: HeldCredit) -> None:
        self._held.pop(credit.credit_id, None)
        idle = self._idle.get((credit.deployment_id, credit.tenant_id))
        if idle and credit in idle:
            idle.remove(credit)

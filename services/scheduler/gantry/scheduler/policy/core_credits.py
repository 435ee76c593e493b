"""The core's side of credits (policy/credits.py holds their rules and book): what granting,
using, revoking and returning one does to the core's counts. Pure; mixed into `SchedulerCore`,
whose state it reads and moves, so the core module keeps to the queue and the cluster.

A credit's slots move exactly as a dispatched call's do: taken on its residency, in its tenant's
running slots of the deployment (slot_shares weighs them) and in its tenant's outstanding count
(TenantBook.lease), and given back together when it is returned or its stream ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from gantry.scheduler.policy.credits import CreditBook, CreditGranted, GrantFacts, may_grant
from gantry.scheduler.policy.events import Decision
from gantry.scheduler.policy.residency_slots import Assignment, ResidencySlots
from gantry.scheduler.policy.types import BreakerState, Outcome, Priority, TenantPolicy

if TYPE_CHECKING:
    from gantry.scheduler.policy.admission import TenantBook
    from gantry.scheduler.policy.breakers import BreakerBoard, BreakerChange
    from gantry.scheduler.policy.core import CoreSettings, _Totals
    from gantry.scheduler.policy.core_routes import _Route
    from gantry.scheduler.policy.deployment_work import DeploymentWork
    from gantry.scheduler.policy.fair_queue import FairQueue, QueuedWork


class CoreCredits:
    _credits: CreditBook
    _contended_at: dict[str, float]  # deployment -> when work last waited for it
    _crediting: set[str]  # the streams (origins) that take credits: only they are granted any
    # deployment -> the calls waiting there that took back one of their own stream's credits
    # instead of counting as contention (`_waits`)
    _own_waits: dict[str, set[str]]

    if TYPE_CHECKING:  # what of SchedulerCore these rules read and move
        _settings: CoreSettings
        _totals: _Totals
        _book: TenantBook
        _residencies: dict[str, ResidencySlots]
        _work: dict[str, DeploymentWork]
        _breakers: BreakerBoard

        _count_outcome: Callable[
            [str, str, ResidencySlots | None, Outcome, str, float], list[BreakerChange]
        ]
        _after_breakers: Callable[[list[BreakerChange], str, float], list[Decision]]
        _settle_many: Callable[[Iterable[str], float], list[Decision]]
        _route: Callable[[str], _Route]
        _slots_of: Callable[[str], tuple[int, int]]
        _work_of: Callable[[str], DeploymentWork]

    def credit_used(
        self,
        origin: str,
        credit_id: str,
        outcome: Outcome,
        now: float,
        *,
        reason: str,
        cost: int,
    ) -> list[Decision]:
        """A call the control plane dispatched on its credit has ended (reported afterwards): it
        counts served for its tenant (and its budget window), and its outcome counts as any call's
        does; the credit keeps its slots until it is returned. An unknown credit (its stream
        ended, or it was returned) counts nothing."""
        grant = self._credits.get(credit_id, origin)
        if grant is None:
            return []
        self._totals.dispatched += 1
        self._totals.credited += 1
        self._book.served(grant.tenant_id, max(1, cost), now)
        residency = self._residencies.get(grant.residency_id)
        deployment_id = grant.deployment_id
        changes = self._count_outcome(grant.node_id, deployment_id, residency, outcome, reason, now)
        return self._after_breakers(changes, deployment_id, now) if changes else []

    def takes_credits(self, origin: str, takes: bool) -> None:
        """Whether the stream's control plane dispatches on credits (its snapshot says): one that
        does not know them would never give one back."""
        if takes:
            self._crediting.add(origin)
        else:
            self._crediting.discard(origin)

    def credit_tenant(self, origin: str, credit_id: str) -> str | None:
        """The tenant a stream's credit serves; None: the stream holds no such credit."""
        grant = self._credits.get(credit_id, origin)
        return grant.tenant_id if grant is not None else None

    def return_credits(self, origin: str, credit_ids: Iterable[str], now: float) -> list[Decision]:
        """The stream gave these credits back: their slots serve what waits."""
        return self._release_credits(self._credits.take_back(origin, credit_ids), now)

    def _offer_credit(
        self, assignment: Assignment, residency: ResidencySlots, now: float
    ) -> list[Decision]:
        """A call through the queue came back a success: a credit for its stream and tenant, if
        the deployment is uncontended (credits.may_grant); it holds its slots from now on."""
        deployment_id, tenant_id = assignment.deployment_id, assignment.tenant_id
        work = self._work.get(deployment_id)
        info = residency.info
        contended_at = self._contended_at.get(deployment_id)
        settings = self._settings
        facts = GrantFacts(
            per_tenant=settings.credits_per_tenant
            if assignment.priority == Priority.INTERACTIVE and assignment.origin in self._crediting
            else 0,
            held=self._credits.held(assignment.origin, deployment_id, tenant_id),
            queue_empty=work is None or not len(work.queue),
            quiet=contended_at is None or now >= contended_at + settings.credit_quiet_seconds,
            routable=residency in self._route(deployment_id).routable
            and self._closed(info.node_id, deployment_id),
            tenant_free=self._book.may_lease(tenant_id),
            free_slots=info.slots - residency.in_flight,
            slots=assignment.slots,
            credit_slots=self._credits.slots_on(deployment_id),
            routable_slots=self._slots_of(deployment_id)[0],
        )
        if not may_grant(facts):
            return []
        grant = self._credits.grant(
            origin=assignment.origin,
            deployment_id=deployment_id,
            tenant_id=tenant_id,
            residency_id=info.residency_id,
            node_id=info.node_id,
            slots=assignment.slots,
        )
        residency.in_flight += grant.slots
        self._book.lease(tenant_id, 1)
        self._work_of(deployment_id).took(tenant_id, grant.slots)
        return [grant]

    def _release_credits(self, grants: list[CreditGranted], now: float) -> list[Decision]:
        """Credits back (returned, or their stream ended): their slots serve what waits."""
        for grant in grants:
            self._book.lease(grant.tenant_id, -1)
            work = self._work.get(grant.deployment_id)
            if work is not None:
                work.released(grant.tenant_id, grant.slots)
            residency = self._residencies.get(grant.residency_id)
            if residency is not None:
                residency.in_flight = max(0, residency.in_flight - grant.slots)
        return self._settle_many({g.deployment_id for g in grants}, now)

    def _waits(
        self, deployment_id: str, queue: FairQueue, arrived: QueuedWork | None, now: float
    ) -> list[Decision]:
        """Work is left waiting for the deployment: contention (`_contended`), unless every call
        waiting is explained by its own stream's credits (credits.py: the grant's race). The one
        that just `arrived` is, when it is INTERACTIVE and its stream holds a credit for its
        (deployment, tenant) not revoked yet: that credit, the newest, is revoked alone."""
        own = self._own_waits.get(deployment_id)
        unexplained = len(queue) - (len(own) if own else 0)
        if unexplained <= 0:
            return []
        if (
            unexplained == 1
            and arrived is not None
            and arrived.priority == Priority.INTERACTIVE
            and arrived.work_id in queue
        ):
            revoked = self._credits.revoke_newest(arrived.origin, deployment_id, arrived.tenant_id)
            if revoked:
                self._own_waits.setdefault(deployment_id, set()).add(arrived.work_id)
                return list(revoked)
        return self._contended(deployment_id, now)

    def _left_waiting(self, deployment_id: str, work_id: str) -> bool:
        """The call left the deployment's queue; whether its wait was its own stream's credits'
        (`_waits`), not contention."""
        own = self._own_waits.get(deployment_id)
        if own is None or work_id not in own:
            return False
        own.discard(work_id)
        if not own:
            del self._own_waits[deployment_id]
        return True

    def _contended(self, deployment_id: str, now: float) -> list[Decision]:
        """Work waits for the deployment: its credits come back, and none go out for a while."""
        self._contended_at[deployment_id] = now
        return list(self._credits.revoke(lambda c: True, deployment_id=deployment_id))

    def _revoke_unserving(self, deployment_id: str) -> list[Decision]:
        """The deployment's credits on a residency that stopped being routable, or whose breakers
        are not both CLOSED."""
        if not self._credits.has(deployment_id):
            return []
        serving = {r.info.residency_id for r in self._route(deployment_id).routable}
        return list(
            self._credits.revoke(
                lambda c: (
                    not (c.residency_id in serving and self._closed(c.node_id, deployment_id))
                ),
                deployment_id=deployment_id,
            )
        )

    def _closed(self, node_id: str, deployment_id: str) -> bool:
        """Both breakers a call there passes are CLOSED (a credit needs no probe's chance)."""
        breakers = self._breakers
        return (
            breakers.state(node_id, deployment_id) == BreakerState.CLOSED
            and breakers.state(node_id) == BreakerState.CLOSED
        )

    def _policies_of_credited(self) -> dict[str, TenantPolicy]:
        return {t: self._book.policy(t) for t in self._credits.tenants()}

    def _revoke_repoliced(self, before: dict[str, TenantPolicy]) -> list[Decision]:
        """Credits of the tenants whose policy changed: they were granted under the old one."""
        changed = {t for t, policy in before.items() if self._book.policy(t) != policy}
        return list(self._credits.revoke(lambda c: c.tenant_id in changed)) if changed else []

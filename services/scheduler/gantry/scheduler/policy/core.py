"""The scheduler's pure core: events and the time in, decisions out. No IO, no clock reads.

It composes the policies (fair queue, tenant admission, resource ledger, placement, circuit
breakers, autoscale advice) and keeps one invariant across them: every piece of submitted work is
at any moment in exactly one place: waiting in its deployment's fair queue, in flight on one
residency, or answered (a Dispatch, or a rejection with its reason). Work leaves the queue without
a decision only when the control plane says its caller has gone, or when the control-plane stream
it came on (its origin) closes.

Work is queued per deployment, so a deployment whose slots are all busy never holds up another
deployment's work (no head-of-line blocking), and fairness is weighed where the contention is.
It is weighed twice there: the fair queue orders what waits, and each tenant takes slots only
while the slots its calls in flight hold are under its weighted share of the deployment's slots
(`slot_shares`), because a model host serves what it holds in arrival order, so the tenants'
shares of the slots in flight are their shares of what is served. Slots are counted in inputs
(`residency_slots`). While a deployment is uncontended, slots may also be leased to a stream ahead
of need (credits: `credits`, `core_credits`); a lease counts as in flight until it comes back, and
work that has to wait revokes them.

The cluster's facts the core is told, and its indexes over them, are `core_cluster`'s; where a
deployment's work can go (its routable residencies, or the refusal) is `core_routes`'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gantry.scheduler.policy.admission import TenantBook
from gantry.scheduler.policy.autoscale import Autoscaler, ScaleAdviceValue
from gantry.scheduler.policy.breakers import NODE_BREAKER, BreakerBoard, BreakerChange
from gantry.scheduler.policy.core_cluster import CoreCluster
from gantry.scheduler.policy.core_credits import CoreCredits
from gantry.scheduler.policy.core_routes import CoreRoutes, _Route
from gantry.scheduler.policy.credits import (
    DEFAULT_CREDITS_PER_TENANT,
    DEFAULT_QUIET_SECONDS,
    CreditBook,
)
from gantry.scheduler.policy.deadlines import Deadlines
from gantry.scheduler.policy.deployment_work import DeploymentWork, scale_signal
from gantry.scheduler.policy.events import (
    CoreSnapshot,
    Decision,
    DeploymentInfo,
    Dispatched,
    NodeInfo,
    PlacementRequest,
    ResidencyLoadView,
    WorkRejected,
    WorkRequest,
)
from gantry.scheduler.policy.fair_queue import FairQueue, QueuedWork
from gantry.scheduler.policy.ledger import Ledger
from gantry.scheduler.policy.placements import Placements
from gantry.scheduler.policy.residency_slots import (
    Assignment,
    ResidencySlots,
    eligibility,
    fitting,
)
from gantry.scheduler.policy.types import (
    Outcome,
    Refusal,
)


@dataclass(frozen=True, kw_only=True)
class CoreSettings:
    global_queue_depth: int = 10_000
    tenant_queue_depth: int = 1_000  # a tenant's waiting work when its policy says 0
    tenant_concurrency: int = 2_000  # a tenant's outstanding work when its policy says 0
    aging_seconds: float = 5.0  # BATCH work waiting this long competes as INTERACTIVE
    breaker_threshold: int = 3
    breaker_cooldown_seconds: float = 30.0
    # A placement's provisional charge, held until its residency is announced or this passes.
    placement_hold_seconds: float = 60.0
    advice_interval_seconds: float = 5.0
    max_in_flight: int = 65_536
    recent_waits: int = 256  # queue waits kept per deployment for the latency signal
    # Credits (policy/credits.py) a stream holds per (deployment, tenant) at most; 0: none, every
    # call goes through the queue (the operator's escape hatch, and the baseline of a bench).
    credits_per_tenant: int = DEFAULT_CREDITS_PER_TENANT
    credit_quiet_seconds: float = DEFAULT_QUIET_SECONDS


@dataclass(slots=True)
class _Totals:
    dispatched: int = 0
    rejected: int = 0
    expired: int = 0
    cancelled: int = 0
    infra_failures: int = 0
    credited: int = 0  # calls the control planes dispatched on credits


# INFRA failures that say the node itself is unwell (its worker's stream is gone or fenced): they
# count on the node's breaker too. Every other failure is the model host's own (it crashed, hung,
# ran out of memory, its runtime failed the call, the call timed out in it) and counts on its
# (node, deployment) breaker alone, so one sick model never closes a whole node.
NODE_REASONS = frozenset({"WORKER_UNAVAILABLE", "STALE_GENERATION"})


class SchedulerCore(CoreCluster, CoreRoutes, CoreCredits):
    def __init__(self, settings: CoreSettings | None = None) -> None:
        self._settings = settings or CoreSettings()
        self._totals = _Totals()  # across resets: what this scheduler process has decided
        self._credits = CreditBook()  # across resets too: a credit id is never issued twice
        self.reset()

    def reset(self) -> None:
        """Forget the cluster and every queued and in-flight piece of work (no stream is left)."""
        s = self._settings
        self._nodes: dict[str, NodeInfo] = {}
        self._residencies: dict[str, ResidencySlots] = {}
        self._by_deployment: dict[str, set[str]] = {}
        self._by_node: dict[str, set[str]] = {}
        self._deployments: dict[str, DeploymentInfo] = {}
        self._work: dict[str, DeploymentWork] = {}
        self._queued_where: dict[str, str] = {}  # work id -> deployment id
        self._in_flight: dict[str, Assignment] = {}
        self._deadlines = Deadlines()
        self._routes: dict[str, _Route] = {}
        self._ledger = Ledger()
        self._placements = Placements(self._nodes, self._ledger)
        self._book = TenantBook(
            default_queue_depth=s.tenant_queue_depth,
            default_concurrency=s.tenant_concurrency,
            global_queue_depth=s.global_queue_depth,
        )
        self._breakers = BreakerBoard(
            threshold=s.breaker_threshold, cooldown_seconds=s.breaker_cooldown_seconds
        )
        self._autoscaler = Autoscaler()
        self._advice: dict[str, ScaleAdviceValue] = {}
        self._next_advice_at = 0.0
        self._credits.clear()
        self._contended_at: dict[str, float] = {}  # deployment -> when work last waited for it
        self._crediting: set[str] = set()
        self._own_waits: dict[str, set[str]] = {}

    # ---- work -----------------------------------------------------------------------------------

    def submit(self, work: WorkRequest, now: float) -> list[Decision]:
        if work.work_id in self._queued_where or work.work_id in self._in_flight:
            return [WorkRejected(work.work_id, "ALREADY_EXISTS", f"work {work.work_id} is known")]
        priority = self._book.resolve_priority(work.tenant_id, work.priority)
        if isinstance(priority, Refusal):
            return [self._reject(work.work_id, work.tenant_id, priority)]
        refusal = self._unserviceable(work.deployment_id, now) or self._book.admit(
            work.tenant_id, max(1, work.cost), now
        )
        if refusal is not None:
            return [self._reject(work.work_id, work.tenant_id, refusal)]
        deadline_at = now + work.timeout_seconds if work.timeout_seconds > 0 else None
        queued = QueuedWork(
            work_id=work.work_id,
            tenant_id=work.tenant_id,
            deployment_id=work.deployment_id,
            priority=priority,
            cost=max(1, work.cost),
            enqueued_at=now,
            deadline_at=deadline_at,
            inputs=work.inputs if work.inputs > 0 else 1,
            origin=work.origin,
        )
        self._work_of(work.deployment_id).queue.push(
            queued, weight=max(1, self._book.policy(work.tenant_id).weight)
        )
        self._queued_where[work.work_id] = work.deployment_id
        if deadline_at is not None:
            self._deadlines.add(work.work_id, deadline_at)
        return self._pump(work.deployment_id, now, arrived=queued)

    def finish(
        self, work_id: str, outcome: Outcome, now: float, *, reason: str = ""
    ) -> list[Decision]:
        """Work ended. Still queued: its caller went away, so it leaves without an answer.

        `reason` is the failure's ErrorInfo reason: only a node's own failure (NODE_REASONS)
        counts on the node's breaker; a model host's fault counts on its pair's alone.
        """
        deployment_id = self._queued_where.get(work_id)
        if deployment_id is not None:
            self._unqueue(work_id, deployment_id, now)
            self._totals.cancelled += 1
            # Its tenant asks less now, so another tenant's share of the slots may have grown.
            return self._pump(deployment_id, now)
        assignment = self._in_flight.pop(work_id, None)
        if assignment is None:
            return []  # already answered (expired, or from a stream before a reset)
        residency = self._release(assignment)
        deployment_id = assignment.deployment_id
        changes = self._count_outcome(
            assignment.node_id, deployment_id, residency, outcome, reason, now
        )
        if changes:
            return self._after_breakers(changes, deployment_id, now)
        # Nothing that decides routability moved: the freed slot serves, else maybe a credit.
        decisions = self._pump(deployment_id, now)
        if outcome == Outcome.SUCCESS and residency is not None:
            decisions.extend(self._offer_credit(assignment, residency, now))
        return decisions

    def _count_outcome(
        self,
        node_id: str,
        deployment_id: str,
        residency: ResidencySlots | None,
        outcome: Outcome,
        reason: str,
        now: float,
    ) -> list[BreakerChange]:
        """A call's outcome in the totals and its breakers: the breaker moves it made."""
        if outcome == Outcome.CANCELLED:
            self._totals.cancelled += 1
        elif outcome == Outcome.INFRA_FAILURE:
            self._totals.infra_failures += 1
        if residency is not None and outcome == Outcome.INFRA_FAILURE:
            residency.infra_failures += 1
        # A residency already forgotten (COLD, its deployment removed, its node deleted) keeps
        # no breaker: a late outcome would bring back a row for what no longer exists. Its
        # node's own breaker still counts while the node is known.
        if residency is not None:
            breaker_key = deployment_id
        elif node_id in self._nodes:
            breaker_key = NODE_BREAKER
        else:
            return []
        return self._breakers.record(
            node_id, breaker_key, outcome, now, node_wide=reason in NODE_REASONS
        )

    def _after_breakers(
        self, changes: list[BreakerChange], deployment_id: str, now: float
    ) -> list[Decision]:
        self._routes.clear()
        decisions: list[Decision] = list(changes)
        affected = {deployment_id} | self._affected_by(changes)
        decisions.extend(self._settle_many(affected, now))
        return decisions

    def drop_origin(self, origin: str, now: float) -> list[Decision]:
        """A control-plane stream closed. Its work still queued leaves without an answer (its
        control plane failed those callers when the stream dropped); its work in flight gives its
        slots back with no outcome (none will come, and a stream's end says nothing about a
        model's health, so no breaker hears of it). Other streams' work stays as it is, and what
        of it waits for the freed slots is served now."""
        affected: set[str] = set()
        for work_id, deployment_id in list(self._queued_where.items()):
            queued = self._work[deployment_id].queue.find(work_id)
            if queued is not None and queued.origin == origin:
                self._unqueue(work_id, deployment_id, now)
                self._totals.cancelled += 1
                affected.add(deployment_id)
        for work_id, assignment in list(self._in_flight.items()):
            if assignment.origin == origin:
                del self._in_flight[work_id]
                self._release(assignment)
                self._totals.cancelled += 1
                affected.add(assignment.deployment_id)
        self._crediting.discard(origin)
        decisions = self._release_credits(self._credits.drop(origin), now)
        return decisions + self._settle_many(affected, now)

    def place(self, request: PlacementRequest, now: float) -> Decision:
        serving = {
            self._residencies[rid].info.node_id
            for rid in self._by_deployment.get(request.deployment_id, ())
        }
        return self._placements.place(
            request, exclude=serving, hold_until=now + self._settings.placement_hold_seconds
        )

    def release_holds(self, deployment_id: str, node_ids: Iterable[str]) -> list[Decision]:
        """Placed nodes the control plane did not use: their holds lapse now (a hold already
        turned into a residency, or lapsed, is not there to release)."""
        self._placements.release(deployment_id, node_ids)
        return []

    def tick(self, now: float) -> list[Decision]:
        """Every time-driven rule: deadlines, breaker cooldowns, placement holds, advice."""
        decisions: list[Decision] = self._expire(now)
        changes = self._breakers.tick(now)
        if changes:
            self._routes.clear()
        decisions.extend(changes)
        self._placements.lapse(now)
        # Aged BATCH work and freed slots are served here too, should no event have pumped them.
        waiting = {d for d, work in self._work.items() if len(work.queue)}
        decisions.extend(self._settle_many(waiting | self._affected_by(changes), now))
        if now >= self._next_advice_at:
            self._next_advice_at = now + self._settings.advice_interval_seconds
            decisions.extend(self._advise(now))
        return decisions

    # ---- reading ------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def queued(self) -> int:
        return len(self._queued_where)

    def snapshot(self, now: float) -> CoreSnapshot:
        return CoreSnapshot(
            queued=len(self._queued_where),
            in_flight=len(self._in_flight),
            dispatched_total=self._totals.dispatched,
            rejected_total=self._totals.rejected,
            expired_total=self._totals.expired,
            cancelled_total=self._totals.cancelled,
            infra_failures_total=self._totals.infra_failures,
            credits=len(self._credits),
            credited_total=self._totals.credited,
            tenants=self._book.loads(now),
            ledger=self._ledger.views(),
            breakers=self._breakers.views(now),
            advice=[self._advice[d] for d in sorted(self._advice)],
            residencies=[
                ResidencyLoadView(
                    residency_id=r.info.residency_id,
                    deployment_id=r.info.deployment_id,
                    node_id=r.info.node_id,
                    phase=r.info.phase,
                    in_flight=r.in_flight,
                    slots=r.info.slots,
                    infra_failures=r.infra_failures,
                    breaker=self._breakers.state(r.info.node_id, r.info.deployment_id),
                )
                for r in sorted(self._residencies.values(), key=lambda r: r.info.residency_id)
            ],
            nodes=[self._nodes[n] for n in sorted(self._nodes)],
        )

    # ---- the rules that move work -------------------------------------------------------------

    def _pump(
        self, deployment_id: str, now: float, *, arrived: QueuedWork | None = None
    ) -> list[Decision]:
        """Serve the deployment's queue while a residency has room, each call to a tenant still
        under its share of the deployment's slots (slot_shares) and to a residency it fits.
        `arrived`: the call just submitted, if that is why it pumps (`_waits`)."""
        work = self._work.get(deployment_id)
        if work is None or not len(work.queue):
            return []
        decisions: list[Decision] = []
        weighed = False
        share: Callable[[QueuedWork], bool] | None = None
        while len(work.queue) and len(self._in_flight) < self._settings.max_in_flight:
            open_ = self._with_room(deployment_id, now)
            if not open_:
                break
            if not weighed:  # weighed once a slot is free: most pumps under load find none
                share = work.under_share(
                    lambda tenant: self._book.policy(tenant).weight,
                    lambda: self._slots_of(deployment_id),
                )
                weighed = True
            queue = work.queue
            eligible = share if queue.all_single_input else eligibility(share, open_, queue)
            queued = queue.pop(now, eligible)
            if queued is None:
                break
            del self._queued_where[queued.work_id]
            own_wait = self._left_waiting(deployment_id, queued.work_id)
            if queued.enqueued_at < now and not own_wait:  # it waited: contended until now
                self._contended_at[deployment_id] = now
            decisions.append(self._start(queued, fitting(open_, queued.inputs), work, now))
        if len(work.queue):  # work waits: contention, so the deployment's credits come back
            decisions.extend(self._waits(deployment_id, work.queue, arrived, now))
        return decisions

    def _start(
        self, queued: QueuedWork, residency: ResidencySlots, work: DeploymentWork, now: float
    ) -> Dispatched:
        info = residency.info
        taken = queued.inputs if queued.inputs <= info.slots else info.slots
        residency.in_flight += taken
        self._in_flight[queued.work_id] = Assignment(
            residency_id=info.residency_id,
            node_id=info.node_id,
            deployment_id=info.deployment_id,
            tenant_id=queued.tenant_id,
            slots=taken,
            origin=queued.origin,
            priority=queued.priority,
        )
        self._book.dispatched(queued.tenant_id, queued.cost)
        work.took(queued.tenant_id, taken)
        self._breakers.started(info.node_id, info.deployment_id, now)
        work.waits.append(now - queued.enqueued_at)
        if len(work.waits) > self._settings.recent_waits:
            work.waits.popleft()
        self._totals.dispatched += 1
        return Dispatched(
            work_id=queued.work_id,
            residency_id=info.residency_id,
            node_id=info.node_id,
            deployment_id=info.deployment_id,
        )

    def _settle(self, deployment_id: str, now: float) -> list[Decision]:
        """Queued work either goes out, keeps waiting for a slot, or (when nothing can ever
        serve it as things stand) is answered at once with the reason."""
        decisions = self._revoke_unserving(deployment_id)
        work = self._work.get(deployment_id)
        if work is None or not len(work.queue):
            return decisions
        refusal = self._unserviceable(deployment_id, now)
        if refusal is None:
            return decisions + self._pump(deployment_id, now)
        for queued in work.queue.drain():
            del self._queued_where[queued.work_id]
            self._left_waiting(deployment_id, queued.work_id)
            self._book.dropped(queued.tenant_id, queued.cost, now, charged_at=queued.enqueued_at)
            decisions.append(self._reject(queued.work_id, queued.tenant_id, refusal))
        return decisions

    def _settle_many(self, deployment_ids: Iterable[str], now: float) -> list[Decision]:
        decisions: list[Decision] = []
        for deployment_id in sorted(deployment_ids):
            decisions.extend(self._settle(deployment_id, now))
        return decisions

    def _expire(self, now: float) -> list[Decision]:
        decisions: list[Decision] = []
        for work_id in self._deadlines.due(now):
            deployment_id = self._queued_where.get(work_id)
            if deployment_id is None:
                continue  # served or gone before its deadline
            queued = self._unqueue(work_id, deployment_id, now)
            if queued is None:
                continue
            self._totals.expired += 1
            waited = now - queued.enqueued_at
            decisions.append(
                self._reject(
                    work_id,
                    queued.tenant_id,
                    Refusal(
                        "DEADLINE_EXCEEDED",
                        f"waited {waited:.1f}s in the queue for deployment {deployment_id} "
                        f"and reached its deadline before a slot freed",
                    ),
                )
            )
        self._deadlines.compact(self._queued_where, len(self._queued_where))
        return decisions

    def _advise(self, now: float) -> list[Decision]:
        decisions: list[Decision] = []
        for deployment_id in sorted(self._deployments):
            deployment = self._deployments[deployment_id]
            if deployment.min_replicas >= deployment.max_replicas:
                continue
            residencies = [
                self._residencies[rid] for rid in self._by_deployment.get(deployment_id, ())
            ]
            signal = scale_signal(deployment, self._work.get(deployment_id), residencies)
            advice = self._autoscaler.advise(signal, now)
            if advice is not None:
                self._advice[deployment_id] = advice
                decisions.append(advice)
        return decisions

    def _reject(self, work_id: str, tenant_id: str, refusal: Refusal) -> WorkRejected:
        self._book.rejected(tenant_id)
        self._totals.rejected += 1
        return WorkRejected(work_id, refusal.reason, refusal.message)

    def _affected_by(self, changes: Sequence[BreakerChange]) -> set[str]:
        affected: set[str] = set()
        for change in changes:
            if change.deployment_id:
                affected.add(change.deployment_id)
            else:
                affected |= self._deployments_on(change.node_id)
        return affected

    def _unqueue(self, work_id: str, deployment_id: str, now: float) -> QueuedWork | None:
        """Queued work leaves unserved: its tenant's queued count and budget charge go back."""
        del self._queued_where[work_id]
        self._left_waiting(deployment_id, work_id)
        queued = self._work_of(deployment_id).queue.remove(work_id)
        if queued is not None:
            self._book.dropped(queued.tenant_id, queued.cost, now, charged_at=queued.enqueued_at)
        return queued

    def _release(self, assignment: Assignment) -> ResidencySlots | None:
        """Work in flight ended: its tenant's count and its residency's slots are given back."""
        self._book.finished(assignment.tenant_id)
        work = self._work.get(assignment.deployment_id)
        if work is not None:
            work.released(assignment.tenant_id, assignment.slots)
        residency = self._residencies.get(assignment.residency_id)
        if residency is not None:
            residency.in_flight = max(0, residency.in_flight - assignment.slots)
        return residency

    def _work_of(self, deployment_id: str) -> DeploymentWork:
        work = self._work.get(deployment_id)
        if work is None:
            work = self._work[deployment_id] = DeploymentWork(
                queue=FairQueue(aging_seconds=self._settings.aging_seconds)
            )
        return work

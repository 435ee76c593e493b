"""The scheduler's pure core: events and the time in, decisions out. No IO, no clock reads.

It composes the policies (fair queue, tenant admission, resource ledger, placement, circuit
breakers, autoscale advice) and keeps one invariant across them: every piece of submitted work is
at any moment in exactly one place: waiting in its deployment's fair queue, in flight on one
residency, or answered (a Dispatch, or a rejection with its reason). Work leaves the queue without
a decision only when the control plane says its caller has gone.

Work is queued per deployment, so a deployment whose slots are all busy never holds up another
deployment's work (no head-of-line blocking), and fairness is weighed where the contention is.
It is weighed twice there: the fair queue orders what waits, and each tenant takes slots only
while the slots its calls in flight hold are under its weighted share of the deployment's slots
(`slot_shares`), because a model host serves what it holds in arrival order, so the tenants'
shares of the slots in flight are their shares of what is served.

Slots are counted in inputs, as a residency announces them (its model host's batch size): a call
takes as many slots as it has inputs (an Embed of 8 texts takes 8 of 32), at most all of its
residency's, so a call bigger than a residency runs there alone. Counted per call, 32 slots let
32 calls of 8 inputs out at once, 256 inputs for a host that works on 32: the rest waited in the
host, beyond a tenant's max_queue_depth, which counts only the calls waiting here.
"""

from __future__ import annotations

import dataclasses
import heapq
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gantry.scheduler.policy.admission import TenantBook
from gantry.scheduler.policy.autoscale import Autoscaler, ScaleAdviceValue, ScaleSignal
from gantry.scheduler.policy.breakers import NODE_BREAKER, BreakerBoard, BreakerChange
from gantry.scheduler.policy.deployment_work import DeploymentWork
from gantry.scheduler.policy.events import (
    CoreSnapshot,
    Decision,
    DeploymentInfo,
    Dispatched,
    NodeInfo,
    PlacementMade,
    PlacementRefused,
    PlacementRequest,
    ResidencyInfo,
    ResidencyLoadView,
    WorkRejected,
    WorkRequest,
)
from gantry.scheduler.policy.fair_queue import FairQueue, QueuedWork
from gantry.scheduler.policy.ledger import Ledger
from gantry.scheduler.policy.placement import NodeCandidate, NotPlaced, gpu_facts, place
from gantry.scheduler.policy.types import (
    BreakerState,
    Outcome,
    Refusal,
    ResidencyPhase,
    TenantPolicy,
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


@dataclass(slots=True)
class _Residency:
    info: ResidencyInfo
    in_flight: int = 0  # slots held by its calls in flight: their inputs, not their count
    infra_failures: int = 0


@dataclass(frozen=True, slots=True)
class _Assignment:
    residency_id: str
    node_id: str
    deployment_id: str
    tenant_id: str
    slots: int  # what it holds of its residency's slots: its inputs, at most all of them


@dataclass(slots=True)
class _Totals:
    dispatched: int = 0
    rejected: int = 0
    expired: int = 0
    cancelled: int = 0
    infra_failures: int = 0


# INFRA failures that say the node itself is unwell (its worker's stream is gone or fenced): they
# count on the node's breaker too. Every other failure is the model host's own (it crashed, hung,
# ran out of memory, its runtime failed the call, the call timed out in it) and counts on its
# (node, deployment) breaker alone, so one sick model never closes a whole node.
NODE_REASONS = frozenset({"WORKER_UNAVAILABLE", "STALE_GENERATION"})


@dataclass(frozen=True, slots=True)
class _Route:
    routable: list[_Residency]  # by node id, then residency id
    refusal: Refusal | None


def _hold_id(deployment_id: str, node_id: str) -> str:
    return f"placement:{deployment_id}:{node_id}"


class SchedulerCore:
    def __init__(self, settings: CoreSettings | None = None) -> None:
        self._settings = settings or CoreSettings()
        self._totals = _Totals()  # across resets: what this scheduler process has decided
        self.reset()

    def reset(self) -> None:
        """Forget the cluster and every queued and in-flight piece of work (a new stream)."""
        s = self._settings
        self._nodes: dict[str, NodeInfo] = {}
        self._residencies: dict[str, _Residency] = {}
        self._by_deployment: dict[str, set[str]] = {}
        self._by_node: dict[str, set[str]] = {}
        self._deployments: dict[str, DeploymentInfo] = {}
        self._work: dict[str, DeploymentWork] = {}
        self._queued_where: dict[str, str] = {}  # work id -> deployment id
        self._in_flight: dict[str, _Assignment] = {}
        self._deadlines: list[tuple[float, int, str]] = []
        self._sequence = 0
        # Provisional placement charges: deployment -> node -> when the hold lapses.
        self._holds: dict[str, dict[str, float]] = {}
        self._candidates: list[NodeCandidate] | None = None  # the nodes placement weighs
        self._routes: dict[str, _Route] = {}
        self._ledger = Ledger()
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

    # ---- cluster state --------------------------------------------------------------------------

    def load_cluster(
        self,
        *,
        nodes: Iterable[NodeInfo],
        residencies: Iterable[ResidencyInfo],
        deployments: Iterable[DeploymentInfo],
        policies: Iterable[TenantPolicy],
        now: float,
    ) -> list[Decision]:
        """A full snapshot replaces everything: nothing queued survives a resynchronisation (the
        control plane failed every waiter when the old stream dropped)."""
        self.reset()
        self._book.replace_policies(policies)
        for node in nodes:
            self.upsert_node(node, now)
        for deployment in deployments:
            self.upsert_deployment(deployment)
        for residency in residencies:
            self.upsert_residency(residency, now)
        return []

    def upsert_node(self, node: NodeInfo, now: float) -> list[Decision]:
        previous = self._nodes.get(node.node_id)
        self._nodes[node.node_id] = node
        self._routes.clear()
        self._candidates = None
        self._ledger.set_node(
            node.node_id, node.domains, max_holders=node.max_residencies, external=node.external
        )
        if previous is not None and previous.connected == node.connected:
            return []
        return self._settle_many(self._deployments_on(node.node_id), now)

    def remove_node(self, node_id: str, now: float) -> list[Decision]:
        """The node was deleted: it leaves every view (nodes, ledger, breakers, residencies), its
        placement holds lapse now, and work queued for what it served is settled without it."""
        self._nodes.pop(node_id, None)
        self._routes.clear()
        self._candidates = None
        affected = self._deployments_on(node_id)
        for rid in sorted(self._by_node.get(node_id, ())):
            self._ledger.release(rid)
            self._forget_residency(self._residencies[rid])
        self._by_node.pop(node_id, None)
        for deployment_id in [d for d, held in self._holds.items() if node_id in held]:
            held = self._holds[deployment_id]
            del held[node_id]
            if not held:
                del self._holds[deployment_id]
        self._ledger.remove_node(node_id)  # and with it the holds' charges
        self._breakers.forget(node_id)
        return self._settle_many(affected, now)

    def upsert_residency(self, residency: ResidencyInfo, now: float) -> list[Decision]:
        rid, deployment_id = residency.residency_id, residency.deployment_id
        previous = self._residencies.get(rid)
        self._routes.clear()
        if residency.phase in (ResidencyPhase.COLD, 0):
            self._ledger.release(rid)
            if previous is None:
                return []
            self._forget_residency(previous)
            return self._settle(deployment_id, now)
        if previous is not None and previous.info.node_id != residency.node_id:
            self._forget_residency(previous)
            previous = None
        if residency.slots < 1:  # a model host takes at least one call at a time
            residency = dataclasses.replace(residency, slots=1)
        if (
            previous is not None
            and previous.info.phase != ResidencyPhase.RESIDENT
            and residency.phase == ResidencyPhase.RESIDENT
        ):
            # Resident again after a restart: a new model host, whose health its predecessor's
            # failures say nothing about.
            self._breakers.forget(residency.node_id, deployment_id)
        self._residencies[rid] = _Residency(
            info=residency,
            in_flight=previous.in_flight if previous else 0,
            infra_failures=previous.infra_failures if previous else 0,
        )
        self._by_deployment.setdefault(deployment_id, set()).add(rid)
        self._by_node.setdefault(residency.node_id, set()).add(rid)
        self._ledger.charge(
            rid,
            residency.node_id,
            residency.claims,
            replaces=residency.replaces,
            uncertain=residency.phase == ResidencyPhase.UNCERTAIN,
        )
        # The residency now carries the charge its placement held provisionally.
        held = self._holds.get(deployment_id)
        if held is not None and held.pop(residency.node_id, None) is not None:
            self._ledger.release(_hold_id(deployment_id, residency.node_id))
            if not held:
                del self._holds[deployment_id]
        return self._settle(deployment_id, now)

    def upsert_deployment(self, deployment: DeploymentInfo) -> None:
        self._deployments[deployment.deployment_id] = deployment

    def remove_deployment(self, deployment_id: str, now: float) -> list[Decision]:
        """Unloaded or deleted: no more advice, its breakers forgotten (their failures were
        its model hosts', which are going). Its residencies leave as each goes COLD; work still
        queued is served by one still resident or answered at once, and then its queue goes."""
        self._deployments.pop(deployment_id, None)
        self._advice.pop(deployment_id, None)
        self._autoscaler.forget(deployment_id)
        self._breakers.forget_deployment(deployment_id)
        self._routes.pop(deployment_id, None)
        decisions = self._settle(deployment_id, now)
        work = self._work.get(deployment_id)
        if work is not None and work.idle:
            del self._work[deployment_id]
        return decisions

    def set_policies(self, policies: Iterable[TenantPolicy]) -> None:
        """Applied at once: the next admission and the next push read the new values."""
        for policy in policies:
            self._book.set_policy(policy)

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
        )
        self._work_of(work.deployment_id).queue.push(
            queued, weight=max(1, self._book.policy(work.tenant_id).weight)
        )
        self._queued_where[work.work_id] = work.deployment_id
        if deadline_at is not None:
            self._sequence += 1
            heapq.heappush(self._deadlines, (deadline_at, self._sequence, work.work_id))
        return self._pump(work.deployment_id, now)

    def finish(
        self, work_id: str, outcome: Outcome, now: float, *, reason: str = ""
    ) -> list[Decision]:
        """Work ended. Still queued: its caller went away, so it leaves without an answer.

        `reason` is the failure's ErrorInfo reason: only a node's own failure (NODE_REASONS)
        counts on the node's breaker; a model host's fault counts on its pair's alone.
        """
        deployment_id = self._queued_where.pop(work_id, None)
        if deployment_id is not None:
            removed = self._work_of(deployment_id).queue.remove(work_id)
            if removed is not None:
                self._book.dropped(
                    removed.tenant_id, removed.cost, now, charged_at=removed.enqueued_at
                )
            self._totals.cancelled += 1
            # Its tenant asks less now, so another tenant's share of the slots may have grown.
            return self._pump(deployment_id, now)
        assignment = self._in_flight.pop(work_id, None)
        if assignment is None:
            return []  # already answered (expired, or from a stream before a reset)
        if outcome == Outcome.CANCELLED:
            self._totals.cancelled += 1
        elif outcome == Outcome.INFRA_FAILURE:
            self._totals.infra_failures += 1
        self._book.finished(assignment.tenant_id)
        work = self._work.get(assignment.deployment_id)
        if work is not None:
            work.released(assignment.tenant_id, assignment.slots)
        residency = self._residencies.get(assignment.residency_id)
        if residency is not None:
            residency.in_flight = max(0, residency.in_flight - assignment.slots)
            if outcome == Outcome.INFRA_FAILURE:
                residency.infra_failures += 1
        # A residency already forgotten (COLD, its deployment removed, its node deleted) keeps
        # no breaker: a late outcome would bring back a row for what no longer exists. Its
        # node's own breaker still counts while the node is known.
        if residency is not None:
            breaker_key = assignment.deployment_id
        elif assignment.node_id in self._nodes:
            breaker_key = NODE_BREAKER
        else:
            return self._pump(assignment.deployment_id, now)
        changes = self._breakers.record(
            assignment.node_id,
            breaker_key,
            outcome,
            now,
            node_wide=reason in NODE_REASONS,
        )
        if not changes:  # nothing that decides routability moved: the freed slot serves
            return self._pump(assignment.deployment_id, now)
        self._routes.clear()
        decisions: list[Decision] = list(changes)
        affected = {assignment.deployment_id} | self._affected_by(changes)
        decisions.extend(self._settle_many(affected, now))
        return decisions

    def place(self, request: PlacementRequest, now: float) -> Decision:
        holding = {
            self._residencies[rid].info.node_id
            for rid in self._by_deployment.get(request.deployment_id, ())
        } | set(self._holds.get(request.deployment_id, ()))
        if self._candidates is None:
            self._candidates = [
                NodeCandidate(
                    node_id=n.node_id,
                    connected=n.connected,
                    labels=n.labels,
                    gpus=gpu_facts(n.gpus, n.domains),
                )
                for n in self._nodes.values()
            ]
        result = place(
            nodes=self._candidates,
            ledger=self._ledger,
            claims=request.claims,
            required_labels=request.required_labels,
            replicas=max(1, request.replicas),
            exclude=holding,
            policy=request.policy,
            gpu=request.gpu,
        )
        if isinstance(result, NotPlaced):
            return PlacementRefused(
                request_id=request.request_id,
                deployment_id=request.deployment_id,
                reason=result.reason,
                message=result.message,
                node_refusals=tuple(result.node_refusals),
            )
        held = self._holds.setdefault(request.deployment_id, {})
        for node_id in result.node_ids:
            self._ledger.charge(_hold_id(request.deployment_id, node_id), node_id, request.claims)
            held[node_id] = now + self._settings.placement_hold_seconds
        return PlacementMade(
            request_id=request.request_id,
            deployment_id=request.deployment_id,
            node_ids=tuple(result.node_ids),
        )

    def release_holds(self, deployment_id: str, node_ids: Iterable[str]) -> list[Decision]:
        """Placed nodes the control plane did not use: their holds lapse now (a hold already
        turned into a residency, or lapsed, is not there to release)."""
        held = self._holds.get(deployment_id, {})
        for node_id in node_ids:
            if held.pop(node_id, None) is not None:
                self._ledger.release(_hold_id(deployment_id, node_id))
        if not held:
            self._holds.pop(deployment_id, None)
        return []

    def tick(self, now: float) -> list[Decision]:
        """Every time-driven rule: deadlines, breaker cooldowns, placement holds, advice."""
        decisions: list[Decision] = self._expire(now)
        changes = self._breakers.tick(now)
        if changes:
            self._routes.clear()
        decisions.extend(changes)
        for deployment_id, held in list(self._holds.items()):
            for node_id, lapses_at in list(held.items()):
                if lapses_at <= now:
                    del held[node_id]
                    self._ledger.release(_hold_id(deployment_id, node_id))
            if not held:
                del self._holds[deployment_id]
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

    def _pump(self, deployment_id: str, now: float) -> list[Decision]:
        """Serve the deployment's queue while a residency has room, each call to a tenant still
        under its share of the deployment's slots (slot_shares) and to a residency it fits."""
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
            eligible = share if queue.all_single_input else _eligibility(share, open_, queue)
            queued = queue.pop(now, eligible)
            if queued is None:
                break
            del self._queued_where[queued.work_id]
            decisions.append(self._start(queued, _fitting(open_, queued.inputs), work, now))
        return decisions

    def _with_room(self, deployment_id: str, now: float) -> list[_Residency]:
        """The routable residencies with a free slot whose breakers let a call through, by node
        id, then residency id."""
        return [
            residency
            for residency in self._route(deployment_id).routable
            if residency.in_flight < residency.info.slots
            and self._breakers.allows(residency.info.node_id, deployment_id, now)
        ]

    def _slots_of(self, deployment_id: str) -> tuple[int, int]:
        """The deployment's routable slots, and the most one of its residencies has."""
        slots = [r.info.slots for r in self._route(deployment_id).routable]
        return sum(slots), max(slots, default=1)

    def _start(
        self, queued: QueuedWork, residency: _Residency, work: DeploymentWork, now: float
    ) -> Dispatched:
        info = residency.info
        taken = queued.inputs if queued.inputs <= info.slots else info.slots
        residency.in_flight += taken
        self._in_flight[queued.work_id] = _Assignment(
            residency_id=info.residency_id,
            node_id=info.node_id,
            deployment_id=info.deployment_id,
            tenant_id=queued.tenant_id,
            slots=taken,
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
        work = self._work.get(deployment_id)
        if work is None or not len(work.queue):
            return []
        refusal = self._unserviceable(deployment_id, now)
        if refusal is None:
            return self._pump(deployment_id, now)
        decisions: list[Decision] = []
        for queued in work.queue.drain():
            del self._queued_where[queued.work_id]
            self._book.dropped(queued.tenant_id, queued.cost, now, charged_at=queued.enqueued_at)
            decisions.append(self._reject(queued.work_id, queued.tenant_id, refusal))
        return decisions

    def _settle_many(self, deployment_ids: Iterable[str], now: float) -> list[Decision]:
        decisions: list[Decision] = []
        for deployment_id in sorted(deployment_ids):
            decisions.extend(self._settle(deployment_id, now))
        return decisions

    def _unserviceable(self, deployment_id: str, now: float) -> Refusal | None:
        return self._route(deployment_id).refusal

    def _route(self, deployment_id: str) -> _Route:
        """The deployment's routable residencies and whether any can serve, cached until a node,
        a residency or a breaker changes (the hot path reads it on every submit and dispatch)."""
        route = self._routes.get(deployment_id)
        if route is None:
            routable = sorted(
                (
                    self._residencies[rid]
                    for rid in self._by_deployment.get(deployment_id, ())
                    if self._routable(self._residencies[rid].info)
                ),
                key=lambda r: (r.info.node_id, r.info.residency_id),
            )
            route = self._routes[deployment_id] = _Route(
                routable=routable,
                refusal=self._refusal(deployment_id, [r.info for r in routable]),
            )
        return route

    def _refusal(self, deployment_id: str, routable: list[ResidencyInfo]) -> Refusal | None:
        if not routable:
            return Refusal(
                "DEPLOYMENT_NOT_READY",
                f"deployment {deployment_id} has no resident residency on a connected node",
            )
        if all(self._open(info) for info in routable):
            return Refusal(
                "CIRCUIT_OPEN",
                f"every residency of deployment {deployment_id} has an open circuit breaker "
                f"after repeated infrastructure failures; retry after the cooldown "
                f"({self._settings.breaker_cooldown_seconds:g}s)",
            )
        return None

    def _routable(self, info: ResidencyInfo) -> bool:
        node = self._nodes.get(info.node_id)
        return info.phase == ResidencyPhase.RESIDENT and node is not None and node.connected

    def _open(self, info: ResidencyInfo) -> bool:
        return (
            self._breakers.state(info.node_id, info.deployment_id) == BreakerState.OPEN
            or self._breakers.state(info.node_id, "") == BreakerState.OPEN
        )

    def _expire(self, now: float) -> list[Decision]:
        decisions: list[Decision] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, work_id = heapq.heappop(self._deadlines)
            deployment_id = self._queued_where.pop(work_id, None)
            if deployment_id is None:
                continue  # served or gone before its deadline
            queued = self._work_of(deployment_id).queue.remove(work_id)
            if queued is None:
                continue
            self._book.dropped(queued.tenant_id, queued.cost, now, charged_at=queued.enqueued_at)
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
        # Entries of work served before its deadline stay in the heap until then: compact
        # when they outnumber the queue by far, so the heap stays bounded by the queue.
        if len(self._deadlines) > 4 * len(self._queued_where) + 1024:
            self._deadlines = [e for e in self._deadlines if e[2] in self._queued_where]
            heapq.heapify(self._deadlines)
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
            work = self._work.get(deployment_id)
            waits = list(work.waits) if work else []
            advice = self._autoscaler.advise(
                ScaleSignal(
                    deployment_id=deployment_id,
                    replicas=deployment.replicas,
                    min_replicas=deployment.min_replicas,
                    max_replicas=deployment.max_replicas,
                    queued=sum(work.queue.waiting_inputs().values()) if work else 0,
                    in_flight=sum(r.in_flight for r in residencies),
                    slots_per_replica=max([max(1, r.info.slots) for r in residencies] or [1]),
                    queue_wait_p50=statistics.median(waits) if waits else 0.0,
                ),
                now,
            )
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

    def _deployments_on(self, node_id: str) -> set[str]:
        return {self._residencies[rid].info.deployment_id for rid in self._by_node.get(node_id, ())}

    def _forget_residency(self, residency: _Residency) -> None:
        info = residency.info
        self._residencies.pop(info.residency_id, None)
        self._by_deployment.get(info.deployment_id, set()).discard(info.residency_id)
        self._by_node.get(info.node_id, set()).discard(info.residency_id)
        self._breakers.forget(info.node_id, info.deployment_id)

    def _work_of(self, deployment_id: str) -> DeploymentWork:
        work = self._work.get(deployment_id)
        if work is None:
            work = self._work[deployment_id] = DeploymentWork(
                queue=FairQueue(aging_seconds=self._settings.aging_seconds)
            )
        return work


def _eligibility(
    share: Callable[[QueuedWork], bool] | None, open_: list[_Residency], queue: FairQueue
) -> Callable[[QueuedWork], bool] | None:
    """Which of the tenants' next calls the queue may serve now, asked in fair order: one whose
    tenant is under its share (`share`; None: every tenant is) and that fits a residency with
    room. A call takes its inputs' slots, at most a residency's all, so it fits where that many
    are free or where nothing runs (a call bigger than a residency runs there alone).

    The first call under its share that fits nowhere stops the pop: the calls behind it in fair
    order wait too, so smaller calls never slip past a big one for ever; it goes once its room
    frees. While nothing runs somewhere, every call fits (and while every call waiting has one
    input, which the caller knows without asking).
    """
    if any(not r.in_flight for r in open_):
        return share
    room = max(r.info.slots - r.in_flight for r in open_)
    blocked = False

    def eligible(queued: QueuedWork) -> bool:
        nonlocal blocked
        if blocked or (share is not None and not share(queued)):
            return False
        if queued.inputs <= room:
            return True
        blocked = True
        return False

    return eligible


def _fitting(open_: list[_Residency], inputs: int) -> _Residency:
    """The residency a call goes to: least slots held among those it fits, ties by node id, then
    residency id (the order of `open_`), so the same state gives the same answer. The caller
    allowed only a call that fits one."""
    best: _Residency | None = None
    for residency in open_:
        held, slots = residency.in_flight, residency.info.slots
        if held + min(inputs, slots) > slots:
            continue
        if best is None or held < best.in_flight:
            best = residency
    assert best is not None, "a call was allowed that fits no residency"
    return best

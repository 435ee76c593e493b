"""The core's side of the cluster's facts (policy/core.py holds the work): the nodes,
residencies, deployments and tenant policies the control planes announce, and the indexes the
core keeps over them. Pure; mixed into `SchedulerCore`, whose state it reads and moves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from gantry.scheduler.policy.events import Decision, DeploymentInfo, NodeInfo, ResidencyInfo
from gantry.scheduler.policy.residency_slots import ResidencySlots
from gantry.scheduler.policy.types import ResidencyPhase, TenantPolicy

if TYPE_CHECKING:
    from gantry.scheduler.policy.admission import TenantBook
    from gantry.scheduler.policy.autoscale import Autoscaler, ScaleAdviceValue
    from gantry.scheduler.policy.breakers import BreakerBoard
    from gantry.scheduler.policy.core_routes import _Route
    from gantry.scheduler.policy.deployment_work import DeploymentWork
    from gantry.scheduler.policy.ledger import Ledger
    from gantry.scheduler.policy.placements import Placements


class CoreCluster:
    _nodes: dict[str, NodeInfo]
    _residencies: dict[str, ResidencySlots]
    _by_deployment: dict[str, set[str]]  # deployment id -> its residencies' ids
    _by_node: dict[str, set[str]]  # node id -> its residencies' ids
    _deployments: dict[str, DeploymentInfo]

    if TYPE_CHECKING:  # what of SchedulerCore these rules read and move
        _work: dict[str, DeploymentWork]
        _routes: dict[str, _Route]
        _ledger: Ledger
        _placements: Placements
        _book: TenantBook
        _breakers: BreakerBoard
        _autoscaler: Autoscaler
        _advice: dict[str, ScaleAdviceValue]

        _settle: Callable[[str, float], list[Decision]]
        _settle_many: Callable[[Iterable[str], float], list[Decision]]
        _policies_of_credited: Callable[[], dict[str, TenantPolicy]]
        _revoke_repoliced: Callable[[dict[str, TenantPolicy]], list[Decision]]

    def load_cluster(
        self,
        *,
        nodes: Iterable[NodeInfo],
        residencies: Iterable[ResidencyInfo],
        deployments: Iterable[DeploymentInfo],
        policies: Iterable[TenantPolicy],
        now: float,
    ) -> list[Decision]:
        """The newest snapshot is the truth about the cluster (every control plane reads the same
        database): its nodes, residencies, deployments and tenant policies replace those held,
        and what it no longer lists leaves as a removal would. Work queued and in flight and the
        placement holds stay: other control-plane streams' callers still wait on them (a stream's
        own callers, on its reconnect, were failed by its control plane and leave with its
        origin, `drop_origin`). Queued work is settled once, against the whole new picture, so no
        deployment refuses its work halfway through the replacement (a residency whose id moved).
        """
        nodes, residencies, deployments = list(nodes), list(residencies), list(deployments)
        before = self._policies_of_credited()
        self._book.replace_policies(policies)
        revoked = self._revoke_repoliced(before)
        affected: set[str] = set()
        for node in nodes:
            affected |= self._put_node(node)
        for residency in residencies:
            affected |= self._put_residency(residency)
        for rid in sorted(self._residencies.keys() - {r.residency_id for r in residencies}):
            affected.add(self._drop_residency(self._residencies[rid]))
        for node_id in sorted(self._nodes.keys() - {n.node_id for n in nodes}):
            affected |= self._drop_node(node_id)
        gone = sorted(self._deployments.keys() - {d.deployment_id for d in deployments})
        for deployment_id in gone:
            self._drop_deployment(deployment_id)
        for deployment in deployments:
            self.upsert_deployment(deployment)
        decisions = revoked + self._settle_many(affected | set(gone), now)
        self._forget_idle(gone)
        return decisions

    def upsert_node(self, node: NodeInfo, now: float) -> list[Decision]:
        return self._settle_many(self._put_node(node), now)

    def remove_node(self, node_id: str, now: float) -> list[Decision]:
        """The node was deleted: it leaves every view (nodes, ledger, breakers, residencies), its
        placement holds lapse now, and work queued for what it served is settled without it."""
        return self._settle_many(self._drop_node(node_id), now)

    def upsert_residency(self, residency: ResidencyInfo, now: float) -> list[Decision]:
        return self._settle_many(self._put_residency(residency), now)

    def upsert_deployment(self, deployment: DeploymentInfo) -> None:
        self._deployments[deployment.deployment_id] = deployment

    def remove_deployment(self, deployment_id: str, now: float) -> list[Decision]:
        """Unloaded or deleted: no more advice, its breakers forgotten (their failures were
        its model hosts', which are going). Its residencies leave as each goes COLD; work still
        queued is served by one still resident or answered at once, and then its queue goes."""
        self._drop_deployment(deployment_id)
        decisions = self._settle(deployment_id, now)
        self._forget_idle((deployment_id,))
        return decisions

    def set_policies(self, policies: Iterable[TenantPolicy]) -> list[Decision]:
        """Applied at once: the next admission and the next push read the new values; the
        credits of a tenant whose policy changed are revoked (they were granted under the old)."""
        before = self._policies_of_credited()
        for policy in policies:
            self._book.set_policy(policy)
        return self._revoke_repoliced(before)

    # The cluster's facts changing, each returning the deployments whose queued work must be
    # settled again; the public methods settle at once, a snapshot once at its end.

    def _put_node(self, node: NodeInfo) -> set[str]:
        previous = self._nodes.get(node.node_id)
        self._nodes[node.node_id] = node
        self._routes.clear()
        self._placements.nodes_changed()
        self._ledger.set_node(
            node.node_id, node.domains, max_holders=node.max_residencies, external=node.external
        )
        if previous is not None and previous.connected == node.connected:
            return set()
        return self._deployments_on(node.node_id)

    def _drop_node(self, node_id: str) -> set[str]:
        self._nodes.pop(node_id, None)
        self._routes.clear()
        self._placements.nodes_changed()
        affected = self._deployments_on(node_id)
        for rid in sorted(self._by_node.get(node_id, ())):
            self._drop_residency(self._residencies[rid])
        self._by_node.pop(node_id, None)
        self._placements.forget_node(node_id)
        self._ledger.remove_node(node_id)
        self._breakers.forget(node_id)
        return affected

    def _put_residency(self, residency: ResidencyInfo) -> set[str]:
        rid, deployment_id = residency.residency_id, residency.deployment_id
        previous = self._residencies.get(rid)
        self._routes.clear()
        if residency.phase in (ResidencyPhase.COLD, 0):
            if previous is None:
                self._ledger.release(rid)
                return set()
            return {self._drop_residency(previous)}
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
        self._residencies[rid] = ResidencySlots(
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
        self._placements.release(deployment_id, (residency.node_id,))
        return {deployment_id}

    def _drop_residency(self, residency: ResidencySlots) -> str:
        """It went COLD or left the cluster: its charge and its breaker go; its deployment."""
        self._ledger.release(residency.info.residency_id)
        self._forget_residency(residency)
        return residency.info.deployment_id

    def _drop_deployment(self, deployment_id: str) -> None:
        self._deployments.pop(deployment_id, None)
        self._advice.pop(deployment_id, None)
        self._autoscaler.forget(deployment_id)
        self._breakers.forget_deployment(deployment_id)
        self._routes.pop(deployment_id, None)

    def _forget_idle(self, deployment_ids: Iterable[str]) -> None:
        """Removed deployments whose queue and slots are empty now: their entries go."""
        for deployment_id in deployment_ids:
            work = self._work.get(deployment_id)
            if work is not None and work.idle:
                del self._work[deployment_id]

    def _deployments_on(self, node_id: str) -> set[str]:
        return {self._residencies[rid].info.deployment_id for rid in self._by_node.get(node_id, ())}

    def _forget_residency(self, residency: ResidencySlots) -> None:
        info = residency.info
        self._residencies.pop(info.residency_id, None)
        self._by_deployment.get(info.deployment_id, set()).discard(info.residency_id)
        self._by_node.get(info.node_id, set()).discard(info.residency_id)
        self._breakers.forget(info.node_id, info.deployment_id)

"""Autoscale bounds and what a piece of scale advice does to a deployment. Pure.

The invariant: a deployment's wanted replicas stay within [min_replicas, max_replicas] whatever
the scheduler advises, and only a READY or DEGRADED deployment is scaled (one still placing,
failing or unloading has a lifecycle that owns its replicas). Which residencies leave on a scale
down is decided here too, deterministically, so two passes over the same rows agree.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from gantry.controlplane.platform.state_machines import DeploymentState, ResidencyState

SCALABLE_STATES = frozenset({DeploymentState.READY, DeploymentState.DEGRADED})


class PlacementPolicyName(enum.StrEnum):
    """How a deployment's replicas are placed; the stored names of the proto's PlacementPolicy."""

    BIN_PACK = "BIN_PACK"
    SPREAD = "SPREAD"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaBounds:
    minimum: int
    maximum: int

    @classmethod
    def resolve(cls, *, replicas: int, min_replicas: int, max_replicas: int) -> ReplicaBounds:
        """A bound of 0 means "= replicas" (a legacy row, or a request that left it unset)."""
        return cls(minimum=min_replicas or replicas, maximum=max_replicas or replicas)

    def clamp(self, desired: int) -> int:
        return max(self.minimum, min(self.maximum, desired))

    @property
    def autoscaled(self) -> bool:
        return self.minimum != self.maximum


@dataclass(frozen=True, slots=True, kw_only=True)
class DeploymentScale:
    """What the decision needs of a stored deployment."""

    deployment_id: str
    state: str
    replicas: int
    min_replicas: int
    max_replicas: int

    @property
    def bounds(self) -> ReplicaBounds:
        return ReplicaBounds.resolve(
            replicas=self.replicas, min_replicas=self.min_replicas, max_replicas=self.max_replicas
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Advice:
    """The scheduler's latest word on one deployment."""

    deployment_id: str
    desired_replicas: int
    reason: str = ""


class ScaleKind(enum.Enum):
    UP = "UP"
    DOWN = "DOWN"
    HOLD = "HOLD"  # the clamped advice is what the deployment already wants
    IGNORED = "IGNORED"  # not scalable now (its state); `why` says so


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleAction:
    deployment_id: str
    kind: ScaleKind
    from_replicas: int
    to_replicas: int
    reason: str  # the scheduler's reason, for the audit trail
    why: str = ""  # why the advice was ignored or clamped, for the log


def decide_scale(deployment: DeploymentScale, advice: Advice) -> ScaleAction:
    """The replicas the deployment should want after this advice, within its bounds."""
    if deployment.state not in SCALABLE_STATES:
        return ScaleAction(
            deployment_id=deployment.deployment_id,
            kind=ScaleKind.IGNORED,
            from_replicas=deployment.replicas,
            to_replicas=deployment.replicas,
            reason=advice.reason,
            why=f"the deployment is {deployment.state}; only READY or DEGRADED ones scale",
        )
    bounds = deployment.bounds
    target = bounds.clamp(advice.desired_replicas)
    why = (
        f"advice {advice.desired_replicas} clamped to [{bounds.minimum}, {bounds.maximum}]"
        if target != advice.desired_replicas
        else ""
    )
    if target > deployment.replicas:
        kind = ScaleKind.UP
    elif target < deployment.replicas:
        kind = ScaleKind.DOWN
    else:
        kind = ScaleKind.HOLD
    return ScaleAction(
        deployment_id=deployment.deployment_id,
        kind=kind,
        from_replicas=deployment.replicas,
        to_replicas=target,
        reason=advice.reason,
        why=why,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingReplica:
    """A residency that counts as one of the deployment's replicas and may be asked to leave."""

    residency_id: str
    state: str
    updated_at: dt.datetime


def surplus_replicas(replicas: Sequence[ServingReplica], *, keep: int) -> list[str]:
    """The residencies to drain so that `keep` remain, in the order to drain them.

    Only RESIDENT and LOADING residencies count (one already leaving, UNCERTAIN or COLD is not a
    replica to shed). A load still under way goes first: it serves nothing yet. Then the most
    recently (re)loaded, ties by residency id, so the longest-serving replicas stay.
    """
    countable = [
        r for r in replicas if r.state in (ResidencyState.RESIDENT, ResidencyState.LOADING)
    ]
    surplus = len(countable) - max(keep, 0)
    if surplus <= 0:
        return []
    # Sorting by id first (the sort is stable) breaks ties deterministically.
    ordered = sorted(
        sorted(countable, key=lambda r: r.residency_id, reverse=True),
        key=lambda r: (r.state != ResidencyState.LOADING, -r.updated_at.timestamp()),
    )
    return [r.residency_id for r in ordered[:surplus]]

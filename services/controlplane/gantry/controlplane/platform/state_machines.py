"""The state machines the control plane records, as tables of allowed (from, to) pairs."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from gantry.common.errors import GantryError


class ResidencyState(enum.StrEnum):
    COLD = "COLD"
    LOADING = "LOADING"
    RESIDENT = "RESIDENT"
    DRAINING = "DRAINING"
    UNLOADING = "UNLOADING"
    UNCERTAIN = "UNCERTAIN"


class JobState(enum.StrEnum):
    QUEUED = "QUEUED"
    LEASED = "LEASED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class DeploymentState(enum.StrEnum):
    PENDING = "PENDING"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNLOADED = "UNLOADED"
    FAILED = "FAILED"
    DEGRADED = "DEGRADED"


class NodeState(enum.StrEnum):
    REGISTERED = "REGISTERED"
    CONNECTED = "CONNECTED"
    DISCONNECTED = "DISCONNECTED"
    DISABLED = "DISABLED"


class JobType(enum.StrEnum):
    LOAD = "LOAD"
    UNLOAD = "UNLOAD"
    HEALTH = "HEALTH"
    INSPECT = "INSPECT"  # the evidence pipeline's jobs: no deployment, no residency
    PROBE = "PROBE"


R, J, D = ResidencyState, JobState, DeploymentState

RESIDENCY_TRANSITIONS: Mapping[ResidencyState, frozenset[ResidencyState]] = {
    R.COLD: frozenset({R.LOADING}),
    R.LOADING: frozenset({R.RESIDENT, R.COLD, R.UNCERTAIN, R.UNLOADING}),
    # RESIDENT -> LOADING: its host crashed and the worker restarts it in place.
    R.RESIDENT: frozenset({R.DRAINING, R.UNLOADING, R.COLD, R.UNCERTAIN, R.LOADING}),
    R.DRAINING: frozenset({R.UNLOADING, R.COLD, R.UNCERTAIN}),
    R.UNLOADING: frozenset({R.COLD, R.UNCERTAIN}),
    # An uncertain residency is reconciled by an unload, or by learning the process is gone.
    R.UNCERTAIN: frozenset({R.UNLOADING, R.COLD}),
}

JOB_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    J.QUEUED: frozenset({J.LEASED, J.CANCELLED, J.FAILED}),
    # LEASED -> QUEUED: the lease expired or its generation died before the work started.
    J.LEASED: frozenset({J.RUNNING, J.SUCCEEDED, J.FAILED, J.CANCELLED, J.QUEUED}),
    J.RUNNING: frozenset({J.SUCCEEDED, J.FAILED, J.CANCELLED, J.QUEUED}),
    J.SUCCEEDED: frozenset(),
    J.FAILED: frozenset(),
    J.CANCELLED: frozenset(),
}

DEPLOYMENT_TRANSITIONS: Mapping[DeploymentState, frozenset[DeploymentState]] = {
    D.PENDING: frozenset({D.LOADING, D.FAILED, D.UNLOADING, D.UNLOADED}),
    # LOADING -> DEGRADED: some replicas loaded and serve, others did not (yet).
    D.LOADING: frozenset({D.READY, D.FAILED, D.PENDING, D.UNLOADING, D.DEGRADED}),
    # READY -> PENDING: its only residency was lost (crash, worker gone) and waits to be re-placed.
    # READY -> DEGRADED: it still serves, from fewer healthy residencies than it wants.
    D.READY: frozenset({D.UNLOADING, D.PENDING, D.FAILED, D.DEGRADED}),
    # DEGRADED -> PENDING: the last healthy residency went too; -> READY: it healed.
    D.DEGRADED: frozenset({D.READY, D.UNLOADING, D.PENDING, D.FAILED}),
    D.UNLOADING: frozenset({D.UNLOADED, D.FAILED}),
    # UNLOADED/FAILED -> PENDING: only an operator's RestartDeployment (deployment_admin.py) brings
    # a stopped deployment back, from a fresh start; nothing automatic takes these edges
    # (EXPLICIT_ONLY keeps derived walks off them; settle_deployment leaves stopped states alone).
    D.UNLOADED: frozenset({D.PENDING}),
    D.FAILED: frozenset({D.UNLOADING, D.UNLOADED, D.PENDING}),
}

NODE_TRANSITIONS: Mapping[NodeState, frozenset[NodeState]] = {
    NodeState.REGISTERED: frozenset({NodeState.CONNECTED, NodeState.DISABLED}),
    NodeState.CONNECTED: frozenset({NodeState.DISCONNECTED, NodeState.DISABLED}),
    NodeState.DISCONNECTED: frozenset({NodeState.CONNECTED, NodeState.DISABLED}),
    # Enabling a node lets its worker connect again; it is DISCONNECTED until it does.
    NodeState.DISABLED: frozenset({NodeState.DISCONNECTED}),
}

# Edges only an operator's explicit request takes, one checked step at a time: a derived walk
# (`shortest_path`, e.g. a deployment found READY after an adoption) never passes through them, so
# nothing automatic brings a stopped deployment back.
EXPLICIT_ONLY: Mapping[str, frozenset[tuple[str, str]]] = {
    "deployment": frozenset({(D.UNLOADED, D.PENDING), (D.FAILED, D.PENDING)}),
}

TERMINAL_JOB_STATES = frozenset(s for s, targets in JOB_TRANSITIONS.items() if not targets)

MACHINES: Mapping[str, Mapping[Any, frozenset[Any]]] = {
    "residency": RESIDENCY_TRANSITIONS,
    "job": JOB_TRANSITIONS,
    "deployment": DEPLOYMENT_TRANSITIONS,
    "node": NODE_TRANSITIONS,
}


def check_transition(machine: str, current: str, target: str) -> None:
    """Raise INVALID_STATE_TRANSITION unless the table allows current -> target."""
    table = MACHINES[machine]
    allowed = {str(state) for state in table.get(current, frozenset())}
    if target not in allowed:
        raise GantryError(
            "INVALID_STATE_TRANSITION",
            f"{machine} cannot go from {current} to {target}",
            machine=machine,
            current=str(current),
            target=str(target),
        )


def shortest_path(machine: str, current: str, target: str) -> list[str]:
    """The states to pass through from current to target (excluding current), by the table.

    A derived state (a deployment found READY after an adoption) may be several steps away from
    the recorded one; each step is still a checked, compare-and-set transition.
    """
    table = MACHINES[machine]
    explicit_only = EXPLICIT_ONLY.get(machine, frozenset())
    previous: dict[str, str] = {}
    frontier = [str(current)]
    seen = {str(current)}
    while frontier:
        following: list[str] = []
        for state in frontier:
            if state == str(target):
                path = [state]
                while path[-1] in previous:
                    path.append(previous[path[-1]])
                return list(reversed(path))[1:]
            for step in table.get(state, frozenset()):
                if (state, str(step)) in explicit_only:
                    continue
                if str(step) not in seen:
                    seen.add(str(step))
                    previous[str(step)] = state
                    following.append(str(step))
        frontier = following
    raise GantryError(
        "INVALID_STATE_TRANSITION",
        f"{machine} cannot reach {target} from {current}",
        machine=machine,
        current=str(current),
        target=str(target),
    )

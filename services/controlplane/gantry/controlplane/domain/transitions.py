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


class NodeState(enum.StrEnum):
    REGISTERED = "REGISTERED"
    CONNECTED = "CONNECTED"
    DISCONNECTED = "DISCONNECTED"
    DISABLED = "DISABLED"


class JobType(enum.StrEnum):
    LOAD = "LOAD"
    UNLOAD = "UNLOAD"


R, J, D = ResidencyState, JobState, DeploymentState

RESIDENCY_TRANSITIONS: Mapping[ResidencyState, frozenset[ResidencyState]] = {
    R.COLD: frozenset({R.LOADING}),
    R.LOADING: frozenset({R.RESIDENT, R.COLD, R.UNCERTAIN, R.UNLOADING}),
    R.RESIDENT: frozenset({R.DRAINING, R.UNLOADING, R.COLD, R.UNCERTAIN}),
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
    D.LOADING: frozenset({D.READY, D.FAILED, D.PENDING, D.UNLOADING}),
    # READY -> PENDING: its only residency was lost (crash, worker gone) and waits to be re-placed.
    D.READY: frozenset({D.UNLOADING, D.PENDING, D.FAILED}),
    D.UNLOADING: frozenset({D.UNLOADED, D.FAILED}),
    D.UNLOADED: frozenset(),
    D.FAILED: frozenset({D.UNLOADING, D.UNLOADED}),
}

NODE_TRANSITIONS: Mapping[NodeState, frozenset[NodeState]] = {
    NodeState.REGISTERED: frozenset({NodeState.CONNECTED, NodeState.DISABLED}),
    NodeState.CONNECTED: frozenset({NodeState.DISCONNECTED, NodeState.DISABLED}),
    NodeState.DISCONNECTED: frozenset({NodeState.CONNECTED, NodeState.DISABLED}),
    NodeState.DISABLED: frozenset(),
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

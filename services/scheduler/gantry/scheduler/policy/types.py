"""Values the scheduler's pure policies share: no grpc, no asyncio, no clock reads.

Enum values equal their proto twins (gantry.v1 common/scheduler), so the wire layer converts with
a plain constructor call and a test pins each pair.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Priority(enum.IntEnum):
    INTERACTIVE = 1
    BATCH = 2


class Outcome(enum.IntEnum):
    SUCCESS = 1
    INFRA_FAILURE = 2
    REQUEST_FAILURE = 3
    CANCELLED = 4  # the caller went away: says nothing about health


class ResourceKind(enum.IntEnum):
    UNSPECIFIED = 0
    RAM = 1
    VRAM = 2
    UNIFIED = 3


class PlacementPolicy(enum.IntEnum):
    BIN_PACK = 1
    SPREAD = 2


class BreakerState(enum.IntEnum):
    CLOSED = 1
    OPEN = 2
    HALF_OPEN = 3


@dataclass(frozen=True, slots=True)
class Domain:
    """A node's resource domain: what placement may fill is capacity - margin."""

    name: str
    kind: int  # a ResourceKind value; kept an int so an unknown one survives to be refused
    capacity: int
    margin: int = 0
    device: int = 0


@dataclass(frozen=True, slots=True)
class Claim:
    """One part of a residency's envelope."""

    kind: int  # a ResourceKind value, or an unknown int from a newer control plane
    bytes: int
    device: int = 0


ALL_PRIORITIES = frozenset({Priority.INTERACTIVE, Priority.BATCH})
DEFAULT_BUDGET_WINDOW_SECONDS = 60


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """How the scheduler treats one tenant. 0 for a depth or quota means the scheduler default;
    budget_units 0 means unlimited."""

    tenant_id: str
    weight: int = 1
    max_queue_depth: int = 0
    max_concurrency: int = 0
    budget_units: int = 0
    budget_window_seconds: int = DEFAULT_BUDGET_WINDOW_SECONDS
    allowed_priorities: frozenset[Priority] = field(default=ALL_PRIORITIES)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why something was not admitted or placed: an ErrorInfo reason and a message."""

    reason: str
    message: str


class ResidencyPhase(enum.IntEnum):
    """A residency's state as the control plane records it (values equal the proto's)."""

    COLD = 1
    LOADING = 2
    RESIDENT = 3
    DRAINING = 4
    UNLOADING = 5
    UNCERTAIN = 6

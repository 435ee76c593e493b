"""A RuntimeProbe's life as one table (common.proto ProbeState). Pure: no IO.

QUEUED -> PREPARING -> LOADING -> HEALTHCHECKING -> READY -> UNLOADING -> COMPLETED is the only
way forward; FAILED and CANCELLED end any stage that has not ended; a lost lease or a worker
restart puts a stage that has not ended back to QUEUED, where the re-leased job starts it again.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from gantry.common.errors import GantryError


class ProbeState(enum.StrEnum):
    QUEUED = "QUEUED"
    PREPARING = "PREPARING"
    LOADING = "LOADING"
    HEALTHCHECKING = "HEALTHCHECKING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


P = ProbeState

# The stages a probe walks through when nothing goes wrong, in order.
FORWARD_STAGES: tuple[ProbeState, ...] = (
    P.QUEUED,
    P.PREPARING,
    P.LOADING,
    P.HEALTHCHECKING,
    P.READY,
    P.UNLOADING,
    P.COMPLETED,
)

_ENDINGS = frozenset({P.FAILED, P.CANCELLED})

PROBE_TRANSITIONS: Mapping[ProbeState, frozenset[ProbeState]] = {
    P.QUEUED: frozenset({P.PREPARING}) | _ENDINGS,
    # -> QUEUED: its lease expired or its worker restarted; the job is leased again.
    P.PREPARING: frozenset({P.LOADING, P.QUEUED}) | _ENDINGS,
    P.LOADING: frozenset({P.HEALTHCHECKING, P.QUEUED}) | _ENDINGS,
    P.HEALTHCHECKING: frozenset({P.READY, P.QUEUED}) | _ENDINGS,
    P.READY: frozenset({P.UNLOADING, P.QUEUED}) | _ENDINGS,
    P.UNLOADING: frozenset({P.COMPLETED, P.QUEUED}) | _ENDINGS,
    P.COMPLETED: frozenset(),
    P.FAILED: frozenset(),
    P.CANCELLED: frozenset(),
}

TERMINAL_PROBE_STATES = frozenset(s for s, targets in PROBE_TRANSITIONS.items() if not targets)

_ALLOWED: Mapping[str, frozenset[str]] = {
    str(state): frozenset(str(t) for t in targets) for state, targets in PROBE_TRANSITIONS.items()
}


def check_probe_transition(current: str, target: str) -> None:
    """Raise INVALID_STATE_TRANSITION unless the table allows current -> target."""
    if target not in _ALLOWED.get(str(current), frozenset()):
        raise GantryError(
            "INVALID_STATE_TRANSITION",
            f"probe cannot go from {current} to {target}",
            machine="probe",
            current=str(current),
            target=str(target),
        )


def forward_path(current: str, target: str) -> list[ProbeState]:
    """The stages from current (excluded) to target along the forward chain, each step checked.

    A probe job's final result says the child went through every stage, even where a stage
    report was not seen: the worker reports the stage it enters, but the result is the last word.
    Raises INVALID_STATE_TRANSITION unless target lies ahead of current on the chain (a terminal
    probe goes nowhere; a probe never moves backwards this way).
    """
    names = [str(stage) for stage in FORWARD_STAGES]
    if current not in names or target not in names or names.index(target) <= names.index(current):
        raise GantryError(
            "INVALID_STATE_TRANSITION",
            f"probe cannot go forward from {current} to {target}",
            machine="probe",
            current=str(current),
            target=str(target),
        )
    path = list(FORWARD_STAGES[names.index(current) + 1 : names.index(target) + 1])
    previous = str(current)
    for step in path:
        check_probe_transition(previous, step)
        previous = step
    return path

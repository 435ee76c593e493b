"""The evidence pipeline's other recorded states: an assessment's table and a candidate's status.

A probe has its own module (probe_transitions.py): it is the one with a life worth a table of
its own. An assessment only ever ends once, and a candidate's status is decided when it is made.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from gantry.common.errors import GantryError


class AssessmentState(enum.StrEnum):
    PENDING = "PENDING"  # its INSPECT job has not reported
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


class CandidateStatus(enum.StrEnum):
    LAB_READY = "LAB_READY"
    REJECTED = "REJECTED"


ASSESSMENT_TRANSITIONS: Mapping[AssessmentState, frozenset[AssessmentState]] = {
    AssessmentState.PENDING: frozenset({AssessmentState.COMPLETED, AssessmentState.FAILED}),
    AssessmentState.COMPLETED: frozenset(),
    AssessmentState.FAILED: frozenset(),
}

_ALLOWED: Mapping[str, frozenset[str]] = {
    str(state): frozenset(str(t) for t in targets)
    for state, targets in ASSESSMENT_TRANSITIONS.items()
}


def check_assessment_transition(current: str, target: str) -> None:
    """Raise INVALID_STATE_TRANSITION unless the table allows current -> target."""
    allowed = _ALLOWED.get(str(current), frozenset())
    if target not in allowed:
        raise GantryError(
            "INVALID_STATE_TRANSITION",
            f"assessment cannot go from {current} to {target}",
            machine="assessment",
            current=str(current),
            target=str(target),
        )

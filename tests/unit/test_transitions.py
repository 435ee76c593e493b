"""Every (from, to) pair of every state machine: allowed pairs pass, all others are typed errors."""

from __future__ import annotations

import itertools

import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.domain.transitions import (
    MACHINES,
    ResidencyState,
    check_transition,
)

PAIRS = [
    (machine, current, target)
    for machine, table in MACHINES.items()
    for current, target in itertools.product(table.keys(), table.keys())
]


@pytest.mark.parametrize(("machine", "current", "target"), PAIRS)
def test_every_pair_follows_its_table(machine: str, current: str, target: str):
    allowed = target in MACHINES[machine][current]
    if allowed:
        check_transition(machine, current, target)
    else:
        with pytest.raises(GantryError) as caught:
            check_transition(machine, current, target)
        assert caught.value.reason == "INVALID_STATE_TRANSITION"


def test_residency_lifecycle_from_the_design_is_reachable():
    path = ["COLD", "LOADING", "RESIDENT", "DRAINING", "UNLOADING", "COLD"]
    for current, target in itertools.pairwise(path):
        check_transition("residency", current, target)
    assert ResidencyState.COLD not in MACHINES["residency"][ResidencyState.COLD]


def test_terminal_job_states_go_nowhere():
    for state in ("SUCCEEDED", "FAILED", "CANCELLED"):
        assert MACHINES["job"][state] == frozenset()

"""A late inventory (a replica resumed after SIGSTOP reads what its stream queued): judged only
against records no newer message of the same worker process changed (inventory_rules.Stamp)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from gantry.controlplane.nodes.inventory_rules import (
    STALE_INVENTORY,
    Action,
    RecordFacts,
    ReportedFacts,
    Stamp,
    advanced,
    decide,
    mark_applied,
    older,
    stamp_of,
)
from gantry.controlplane.platform.state_machines import ResidencyState as R

GEN = 7
# The new leader's LOAD result for the residency, applied while the replica was stopped.
RESULT = Stamp(GEN, 12)


def resident(applied: Stamp = RESULT) -> RecordFacts:
    return RecordFacts(
        residency_id="r1",
        deployment_id="d1",
        state=R.RESIDENT,
        generation=GEN,
        artifact_digest="a",
        adapter_digest="b",
        environment_fingerprint="c",
        load_in_flight=False,
        applied=applied,
    )


def held(state: R = R.RESIDENT) -> ReportedFacts:
    return ReportedFacts(
        deployment_id="d1",
        state=state,
        pid=123,
        artifact_digest="a",
        adapter_digest="b",
        environment_fingerprint="c",
        restart_count=0,
        failure_reason="RUNTIME_CRASHED" if state == R.LOADING else "",
        failure_message="",
        crash_loop=False,
    )


def test_an_inventory_taken_before_the_load_result_does_not_make_the_residency_gone():
    # The bug case C found: the inventory, queued before the load, does not list it.
    decisions, unwanted = decide([resident()], {}, generation=GEN, stamp=Stamp(GEN, 9))
    assert decisions[0].action is Action.KEEP
    assert decisions[0].why == STALE_INVENTORY
    assert unwanted == []


def test_an_older_inventory_that_shows_a_restart_changes_nothing():
    decisions, _ = decide(
        [resident()], {"d1": held(R.LOADING)}, generation=GEN, stamp=Stamp(GEN, 11)
    )
    assert decisions[0].action is Action.KEEP


@pytest.mark.parametrize(
    "stamp",
    [
        Stamp(GEN, 13),  # newer than the result: it is the witness again
        Stamp(GEN + 1, 2),  # a new process (its generation) counts from 1: not ordered
        Stamp(GEN, 0),  # an older worker that stamps nothing: judged as before
    ],
)
def test_an_inventory_not_older_than_the_record_is_judged(stamp: Stamp):
    decisions, _ = decide([resident()], {}, generation=stamp.generation, stamp=stamp)
    assert decisions[0].action is Action.GONE


def test_a_record_no_stamped_message_changed_is_judged_by_any_inventory():
    decisions, _ = decide([resident(Stamp())], {}, generation=GEN, stamp=Stamp(GEN, 1))
    assert decisions[0].action is Action.GONE


def test_a_stale_inventory_still_names_what_no_record_accounts_for():
    decisions, unwanted = decide(
        [resident()],
        {"d1": held(), "d9": replace(held(), deployment_id="d9")},
        generation=GEN,
        stamp=Stamp(GEN, 3),
    )
    assert decisions[0].action is Action.KEEP
    assert unwanted == ["d9"]


@pytest.mark.parametrize(
    ("message", "than", "expected"),
    [
        (Stamp(GEN, 3), Stamp(GEN, 4), True),
        (Stamp(GEN, 4), Stamp(GEN, 4), False),  # the same message again: applied idempotently
        (Stamp(GEN, 5), Stamp(GEN, 4), False),
        (Stamp(GEN, 3), Stamp(GEN + 1, 4), False),
        (Stamp(GEN, 0), Stamp(GEN, 4), False),
        (Stamp(GEN, 3), Stamp(GEN, 0), False),
    ],
)
def test_only_stamps_of_one_process_generation_are_ordered(
    message: Stamp, than: Stamp, expected: bool
):
    assert older(message, than) is expected


def test_a_record_stamp_never_moves_back():
    assert advanced(Stamp(GEN, 8), Stamp(GEN, 5)) == Stamp(GEN, 8)
    assert advanced(Stamp(GEN, 8), Stamp(GEN, 9)) == Stamp(GEN, 9)
    assert advanced(Stamp(GEN, 8), Stamp(GEN, 0)) == Stamp(GEN, 8)
    assert advanced(Stamp(GEN, 8), Stamp(GEN + 1, 1)) == Stamp(GEN + 1, 1)


@dataclass
class Row:
    applied_generation: int = 0
    applied_sequence: int = 0


def test_mark_applied_keeps_the_newest_stamp_on_the_row():
    row = Row()
    mark_applied(row, Stamp(GEN, 4))
    mark_applied(row, Stamp(GEN, 2))  # a result read late
    assert stamp_of(row) == Stamp(GEN, 4)

"""What a worker's inventory means for each residency record: every case of inventory_rules."""

from __future__ import annotations

import pytest

from gantry.controlplane.nodes.inventory_rules import (
    Action,
    RecordFacts,
    ReportedFacts,
    decide,
)
from gantry.controlplane.platform.state_machines import ResidencyState as R

GEN = 7


def record(state: R, *, generation: int = GEN, load_in_flight: bool = False, **facts: str):
    values = {"artifact_digest": "a", "adapter_digest": "b", "environment_fingerprint": "c"}
    values.update(facts)
    return RecordFacts(
        residency_id="r1",
        deployment_id="d1",
        state=state,
        generation=generation,
        load_in_flight=load_in_flight,
        **values,
    )


def held(state: R = R.RESIDENT, *, crash_loop: bool = False, **facts: str) -> ReportedFacts:
    values = {"artifact_digest": "a", "adapter_digest": "b", "environment_fingerprint": "c"}
    values.update(facts)
    return ReportedFacts(
        deployment_id="d1",
        state=state,
        pid=123,
        restart_count=1,
        failure_reason="RUNTIME_CRASHED" if state == R.LOADING else "",
        failure_message="",
        crash_loop=crash_loop,
        **values,
    )


def only(records: list[RecordFacts], reported: dict[str, ReportedFacts]) -> Action:
    decisions, _ = decide(records, reported, generation=GEN)
    assert len(decisions) == 1
    return decisions[0].action


def test_an_exact_match_of_the_same_generation_is_adopted():
    assert only([record(R.RESIDENT)], {"d1": held()}) is Action.ADOPT


@pytest.mark.parametrize("fact", ["artifact_digest", "adapter_digest", "environment_fingerprint"])
def test_any_differing_fact_makes_the_resident_uncertain(fact: str):
    decisions, unwanted = decide(
        [record(R.RESIDENT)], {"d1": held(**{fact: "other"})}, generation=GEN
    )
    assert decisions[0].action is Action.UNCERTAIN
    assert fact.split("_")[0] in decisions[0].why
    assert unwanted == []  # an UNCERTAIN record gets its own UNLOAD job


def test_a_resident_from_an_older_generation_is_gone():
    decision = only([record(R.RESIDENT, generation=GEN - 1)], {})
    assert decision is Action.GONE


def test_a_resident_the_worker_no_longer_holds_is_gone():
    assert only([record(R.RESIDENT)], {}) is Action.GONE


def test_a_host_being_restarted_is_recorded_as_restarting():
    assert only([record(R.RESIDENT)], {"d1": held(R.LOADING)}) is Action.RESTARTING


def test_a_restarted_host_back_in_service_is_resident_again():
    assert only([record(R.LOADING)], {"d1": held(R.RESIDENT)}) is Action.RESIDENT


def test_a_first_load_in_flight_is_left_to_its_job_result():
    assert only([record(R.LOADING, load_in_flight=True)], {}) is Action.KEEP
    assert only([record(R.LOADING, load_in_flight=True)], {"d1": held()}) is Action.KEEP


def test_a_stop_the_worker_could_not_verify_is_uncertain():
    assert only([record(R.RESIDENT)], {"d1": held(R.UNCERTAIN)}) is Action.UNCERTAIN


def test_an_unload_settles_once_the_worker_no_longer_holds_it():
    assert only([record(R.UNLOADING)], {}) is Action.UNLOADED
    assert only([record(R.UNCERTAIN)], {}) is Action.UNLOADED
    assert only([record(R.UNLOADING)], {"d1": held()}) is Action.KEEP


def test_what_no_live_record_accounts_for_is_unwanted():
    decisions, unwanted = decide([record(R.COLD)], {"d1": held(), "stray": held()}, generation=GEN)
    assert [d.action for d in decisions] == [Action.KEEP]
    assert unwanted == ["d1", "stray"]


def test_a_record_without_committed_facts_is_adopted_by_what_it_can_compare():
    # Rows committed before the facts were recorded hold empty strings: nothing to compare.
    blank = record(R.RESIDENT, artifact_digest="", adapter_digest="", environment_fingerprint="")
    assert only([blank], {"d1": held()}) is Action.ADOPT


def test_an_open_unload_job_settles_the_record_not_the_inventory():
    unloading = RecordFacts(
        residency_id="r1",
        deployment_id="d1",
        state=R.UNLOADING,
        generation=GEN,
        artifact_digest="a",
        adapter_digest="b",
        environment_fingerprint="c",
        load_in_flight=False,
        unload_in_flight=True,
    )
    assert only([unloading], {}) is Action.KEEP
    assert only([unloading], {"d1": held(R.UNLOADING)}) is Action.KEEP


def test_a_resident_on_its_way_out_is_left_alone():
    assert only([record(R.RESIDENT)], {"d1": held(R.UNLOADING)}) is Action.KEEP

"""CheckInvariants' no_model_host_without_live_residency, judged on rows built in memory."""

from __future__ import annotations

from google.protobuf import json_format

from gantry.controlplane.observability.invariants import (
    _no_model_host_without_live_residency,
    _Rows,
)
from gantry.controlplane.platform.models import Node, Residency
from gantry.controlplane.platform.state_machines import NodeState, ResidencyState
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg

GEN = 4


def node(*held: tuple[str, int], sequence: int = 20, state: str = NodeState.CONNECTED) -> Node:
    """A node whose row shows an inventory (as the gateway writes it) holding `held`."""
    inventory = wg.Inventory(
        generation=GEN,
        sequence=sequence,
        residents=[wg.ResidentModel(deployment_id=d, state=s) for d, s in held],
    )
    return Node(
        node_id="n1",
        state=state,
        generation=GEN,
        inventory={"inventory": json_format.MessageToDict(inventory)},
    )


def residency(state: ResidencyState, *, applied_sequence: int = 10) -> Residency:
    return Residency(
        residency_id="r1",
        deployment_id="d1",
        node_id="n1",
        state=state,
        generation=GEN,
        applied_generation=GEN,
        applied_sequence=applied_sequence,
    )


def broken(n: Node, *residencies: Residency) -> tuple[str, ...]:
    rows = _Rows(node_rows={n.node_id: n}, residencies=residencies, open_jobs=())
    result = _no_model_host_without_live_residency(rows)
    assert result.name == "no_model_host_without_live_residency"
    return result.offending_ids


RESIDENT = common_pb2.RESIDENCY_STATE_RESIDENT


def test_a_host_with_a_resident_record_holds():
    assert broken(node(("d1", RESIDENT)), residency(ResidencyState.RESIDENT)) == ()


def test_a_host_running_for_a_cold_residency_is_named():
    assert broken(node(("d1", RESIDENT)), residency(ResidencyState.COLD)) == (
        "node:n1/deployment:d1",
    )


def test_a_host_with_no_record_on_the_node_is_named():
    assert broken(node(("d2", RESIDENT)), residency(ResidencyState.RESIDENT)) == (
        "node:n1/deployment:d2",
    )


def test_an_inventory_older_than_the_record_does_not_judge_it():
    # The UNLOAD result (sequence 30) made it COLD; the shown inventory (20) predates it.
    assert broken(node(("d1", RESIDENT)), residency(ResidencyState.COLD, applied_sequence=30)) == ()


def test_a_host_the_worker_is_unloading_is_on_its_way_out():
    unloading = common_pb2.RESIDENCY_STATE_UNLOADING
    assert broken(node(("d1", unloading)), residency(ResidencyState.COLD)) == ()


def test_a_disconnected_node_is_not_judged_by_its_last_inventory():
    shown = node(("d1", RESIDENT), state=NodeState.DISCONNECTED)
    assert broken(shown, residency(ResidencyState.COLD)) == ()

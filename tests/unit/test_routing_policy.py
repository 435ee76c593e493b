"""The scheduler's pure routing rules."""

from __future__ import annotations

from gantry.scheduler.policy.cluster import ClusterView
from gantry.scheduler.policy.routing import Refusal, choose_nodes, choose_residency
from gantry.v1 import common_pb2

CONNECTED = common_pb2.NODE_STATE_CONNECTED
RESIDENT = common_pb2.RESIDENCY_STATE_RESIDENT


def _view() -> ClusterView:
    view = ClusterView()
    for node in ("n1", "n2", "n3"):
        view.upsert_node(node, state=CONNECTED, adapters=frozenset({"sentence_transformers"}))
    view.upsert_residency("r1", deployment_id="d", node_id="n1", state=RESIDENT)
    view.upsert_residency("r2", deployment_id="d", node_id="n2", state=RESIDENT)
    return view


def test_least_loaded_resident_wins_with_node_id_tie_break():
    view = _view()
    first = choose_residency(view, "d")
    assert not isinstance(first, Refusal) and first.residency_id == "r1"
    view.start_work("w1", "r1")
    second = choose_residency(view, "d")
    assert not isinstance(second, Refusal) and second.residency_id == "r2"
    view.finish_work("w1")
    assert choose_residency(view, "d").residency_id == "r1"  # type: ignore[union-attr]


def test_residencies_on_disconnected_nodes_or_not_resident_are_skipped():
    view = _view()
    view.upsert_node("n1", state=common_pb2.NODE_STATE_DISCONNECTED, adapters=frozenset())
    view.upsert_residency(
        "r2", deployment_id="d", node_id="n2", state=common_pb2.RESIDENCY_STATE_LOADING
    )
    refusal = choose_residency(view, "d")
    assert isinstance(refusal, Refusal) and refusal.reason == "DEPLOYMENT_NOT_READY"


def test_cold_residencies_leave_the_view():
    view = _view()
    view.upsert_residency(
        "r1", deployment_id="d", node_id="n1", state=common_pb2.RESIDENCY_STATE_COLD
    )
    assert "r1" not in view.residencies


def test_placement_spreads_to_the_emptiest_eligible_node():
    view = _view()
    assert choose_nodes(
        view, deployment_id="e", replicas=1, required_adapter="sentence_transformers"
    ) == ["n3"]
    assert choose_nodes(view, deployment_id="d", replicas=1, required_adapter="") == ["n3"]
    refusal = choose_nodes(view, deployment_id="e", replicas=1, required_adapter="vllm")
    assert isinstance(refusal, Refusal) and refusal.reason == "NO_ELIGIBLE_NODE"
    refusal = choose_nodes(view, deployment_id="e", replicas=4, required_adapter="")
    assert isinstance(refusal, Refusal)

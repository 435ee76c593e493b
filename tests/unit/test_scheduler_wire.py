"""The scheduler's pure values against their proto twins, and the wire conversions."""

from __future__ import annotations

import enum
from typing import Any

import pytest

from gantry.scheduler import wire
from gantry.scheduler.policy.events import Dispatched, PlacementRefused, WorkRejected
from gantry.scheduler.policy.placement import NodeRefusal
from gantry.scheduler.policy.types import (
    BreakerState,
    Outcome,
    PlacementPolicy,
    Priority,
    ResidencyPhase,
    ResourceKind,
)
from gantry.v1 import common_pb2, scheduler_pb2

TWINS: list[tuple[type[enum.IntEnum], Any, str]] = [
    (Priority, common_pb2.Priority, "PRIORITY_"),
    (Outcome, scheduler_pb2.WorkOutcome, "WORK_OUTCOME_"),
    (ResourceKind, common_pb2.ResourceKind, "RESOURCE_KIND_"),
    (BreakerState, scheduler_pb2.BreakerState, "BREAKER_STATE_"),
    (ResidencyPhase, common_pb2.ResidencyState, "RESIDENCY_STATE_"),
    (PlacementPolicy, common_pb2.PlacementPolicy, "PLACEMENT_POLICY_"),
]


@pytest.mark.parametrize(
    ("ours", "proto", "prefix"), TWINS, ids=lambda t: getattr(t, "__name__", "")
)
def test_every_value_equals_its_proto_twin(
    ours: type[enum.IntEnum], proto: Any, prefix: str
) -> None:
    for member in ours:
        assert proto.Value(prefix + member.name) == member.value
    named = {n.removeprefix(prefix) for n in proto.keys()} - {"UNSPECIFIED"}
    assert named == {m.name for m in ours} - {"UNSPECIFIED"}


def test_a_node_without_labels_is_labelled_from_its_adapters() -> None:
    node = wire.node(
        scheduler_pb2.SchedulerNode(
            node_id="n1", state=common_pb2.NODE_STATE_CONNECTED, adapters=["st"]
        )
    )
    assert node.connected and node.labels == {"adapter:st", "device:cpu"}


def test_an_unknown_priority_in_a_policy_grants_nothing_and_zero_fields_take_defaults() -> None:
    policy = wire.tenant_policy(common_pb2.TenantPolicy(tenant_id="t", allowed_priorities=[2, 9]))
    assert policy.allowed_priorities == {Priority.BATCH}
    assert (policy.weight, policy.budget_window_seconds) == (1, 60)


def test_decisions_become_outputs_with_typed_failures() -> None:
    dispatch = wire.output(Dispatched("w1", "r1", "n1", "d1"))
    assert dispatch.dispatch.residency_id == "r1"
    rejected = wire.output(WorkRejected("w2", "QUEUE_FULL", "full"))
    assert (rejected.rejected.failure.reason, rejected.rejected.failure.failure_class) == (
        "QUEUE_FULL",
        common_pb2.FAILURE_CLASS_INFRA,
    )
    refused = wire.output(
        PlacementRefused(
            "p1", "d1", "NO_CAPACITY", "none", (NodeRefusal("n1", "NO_CAPACITY", "x"),)
        )
    )
    assert [r.node_id for r in refused.rejected.node_refusals] == ["n1"]

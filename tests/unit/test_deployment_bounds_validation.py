"""CreateDeployment's replicas, autoscale bounds and placement policy: resolved, then checked,
each violation a typed INVALID_ARGUMENT naming its field."""

from __future__ import annotations

import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.deployments.autoscale_rules import PlacementPolicyName
from gantry.controlplane.platform.validation import (
    MAX_REPLICAS,
    ReplicaRequest,
    check_placement_policy,
    check_replicas,
)
from gantry.v1 import common_pb2


def test_unset_replicas_and_bounds_mean_one_replica_and_no_autoscale():
    assert check_replicas(replicas=0, min_replicas=0, max_replicas=0) == ReplicaRequest(
        replicas=1, min_replicas=1, max_replicas=1
    )


def test_an_unset_bound_is_the_replicas():
    assert check_replicas(replicas=3, min_replicas=0, max_replicas=5) == ReplicaRequest(
        replicas=3, min_replicas=3, max_replicas=5
    )
    assert check_replicas(replicas=3, min_replicas=1, max_replicas=0) == ReplicaRequest(
        replicas=3, min_replicas=1, max_replicas=3
    )


def test_bounds_around_the_replicas_are_kept():
    assert check_replicas(replicas=2, min_replicas=1, max_replicas=MAX_REPLICAS) == (
        ReplicaRequest(replicas=2, min_replicas=1, max_replicas=MAX_REPLICAS)
    )


@pytest.mark.parametrize(
    ("replicas", "min_replicas", "max_replicas", "field"),
    [
        (MAX_REPLICAS + 1, 0, 0, "replicas"),
        (1, 0, MAX_REPLICAS + 1, "max_replicas"),
        (2, 3, 4, "min_replicas"),
        (0, 2, 0, "min_replicas"),  # replicas 0 = 1, under a floor of 2
        (3, 1, 2, "max_replicas"),
    ],
)
def test_each_violation_is_refused_naming_its_field(
    replicas: int, min_replicas: int, max_replicas: int, field: str
):
    with pytest.raises(GantryError) as caught:
        check_replicas(replicas=replicas, min_replicas=min_replicas, max_replicas=max_replicas)
    assert caught.value.reason == "INVALID_ARGUMENT"
    assert caught.value.metadata["field"] == field


def test_a_limit_past_the_maximum_names_the_limit():
    with pytest.raises(GantryError) as caught:
        check_replicas(replicas=1, min_replicas=0, max_replicas=MAX_REPLICAS + 1)
    assert caught.value.metadata["limit"] == str(MAX_REPLICAS)


@pytest.mark.parametrize(
    ("policy", "stored"),
    [
        (common_pb2.PLACEMENT_POLICY_UNSPECIFIED, PlacementPolicyName.BIN_PACK),
        (common_pb2.PLACEMENT_POLICY_BIN_PACK, PlacementPolicyName.BIN_PACK),
        (common_pb2.PLACEMENT_POLICY_SPREAD, PlacementPolicyName.SPREAD),
    ],
)
def test_placement_policies_resolve_unspecified_to_bin_pack(policy: int, stored: str):
    assert check_placement_policy(policy) == stored


def test_a_placement_policy_this_version_does_not_know_is_refused():
    with pytest.raises(GantryError) as caught:
        check_placement_policy(99)
    assert caught.value.reason == "INVALID_ARGUMENT"
    assert caught.value.metadata["field"] == "placement_policy"


def test_every_wire_placement_policy_has_a_stored_name():
    for name, value in common_pb2.PlacementPolicy.items():
        stored = check_placement_policy(value)
        if name != "PLACEMENT_POLICY_UNSPECIFIED":
            assert name == f"PLACEMENT_POLICY_{stored}"

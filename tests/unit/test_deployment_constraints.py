"""The control plane's side of an operator's placement constraints: checked before a deployment
is written (INVALID_ARGUMENT naming the field), stored as JSON and read back the same; the labels
a node was registered with and the GPUs its Hello named reach the scheduler."""

from __future__ import annotations

import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.deployments.requirements import (
    checked_constraints,
    constraints_from_json,
)
from gantry.controlplane.nodes.capabilities import gpus_from_json, gpus_to_json, registered_labels
from gantry.controlplane.nodes.handshake import node_inventory
from gantry.controlplane.platform.announcer import scheduler_node
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg

Constraints = common_pb2.PlacementConstraints


def test_checked_constraints_round_trip_through_their_stored_form() -> None:
    given = Constraints(
        gpu_model=" H100 ",
        min_compute_capability="8.0",
        min_free_vram_bytes=8 << 30,
        node_labels=["zone=a", "rack=7"],
    )
    stored = checked_constraints(given)
    read = constraints_from_json(stored)
    assert read.gpu_model == "H100"  # trimmed: a name is matched as a part of the GPU's name
    assert (read.min_compute_capability, read.min_free_vram_bytes) == ("8.0", 8 << 30)
    assert list(read.node_labels) == ["zone=a", "rack=7"]
    assert checked_constraints(Constraints()) == {}
    assert constraints_from_json({}) == Constraints() == constraints_from_json(None)


@pytest.mark.parametrize(
    ("given", "field", "said"),
    [
        (Constraints(gpu_model="   "), "constraints.gpu_model", "1 to 128 characters"),
        (Constraints(gpu_model="x" * 129), "constraints.gpu_model", "1 to 128 characters"),
        (
            Constraints(min_compute_capability="8"),
            "constraints.min_compute_capability",
            "'8' is not major.minor",
        ),
        (
            Constraints(node_labels=["zone=a", "device:cuda"]),
            "constraints.node_labels",
            "node label 'device:cuda' is not key=value",
        ),
    ],
)
def test_a_constraint_that_could_never_be_compared_is_refused(
    given: common_pb2.PlacementConstraints, field: str, said: str
) -> None:
    with pytest.raises(GantryError) as refused:
        checked_constraints(given)
    assert refused.value.reason == "INVALID_ARGUMENT"
    assert refused.value.metadata.get("field") == field
    assert said in refused.value.message


def test_a_nodes_registered_labels_and_named_gpus_reach_the_scheduler_node() -> None:
    gpus = [common_pb2.GpuDevice(device=0, name="NVIDIA A10", compute_capability="8.6")]
    inventory = node_inventory(wg.Hello(gpus=gpus))
    assert gpus_from_json(gpus_to_json(gpus)) == gpus
    assert registered_labels({"zone": "a", "rack": "7"}) == ["zone=a", "rack=7"]
    node = scheduler_node("n1", 1, inventory, connected={"n1"}, labels={"zone": "a"})
    assert list(node.gpus) == gpus
    assert "zone=a" in node.labels and "device:cpu" in node.labels
    # The Hello's own "gpus" key is the heartbeat's reading: the named GPUs live apart from it.
    assert "gpus" not in inventory


def test_an_inventory_stored_before_gpus_were_named_has_none() -> None:
    node = scheduler_node("n1", 1, {"adapters": ["sentence_transformers"]}, connected=())
    assert list(node.gpus) == []

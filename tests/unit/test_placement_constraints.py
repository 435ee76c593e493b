"""The operator's placement constraints in the scheduler's pure placement: a GPU model, a minimum
compute capability, a minimum of free VRAM (on one GPU, the one the replica's VRAM claim names)
and node labels. Each refuses a node that lacks it, naming what is missing; all met, it places.
"""

from __future__ import annotations

import pytest

from gantry.scheduler import wire
from gantry.scheduler.policy.core import SchedulerCore
from gantry.scheduler.policy.events import NodeInfo, PlacementMade, PlacementRefused
from gantry.scheduler.policy.ledger import Ledger
from gantry.scheduler.policy.placement import (
    GpuConstraints,
    GpuFacts,
    NodeCandidate,
    NotPlaced,
    Placed,
    gpu_facts,
    parse_compute_capability,
    place,
)
from gantry.scheduler.policy.types import Claim, Domain, PlacementPolicy, ResourceKind
from gantry.v1 import common_pb2, scheduler_pb2

GIB = 1 << 30
RAM = ResourceKind.RAM
VRAM = ResourceKind.VRAM
A10 = GpuFacts(0, "NVIDIA A10", "8.6")
H100 = GpuFacts(0, "NVIDIA H100 80GB HBM3", "9.0")
T4 = GpuFacts(0, "Tesla T4", "7.5")


def gpu_node(node_id: str, *gpus: GpuFacts, labels: tuple[str, ...] = ()) -> NodeCandidate:
    return NodeCandidate(node_id, True, frozenset(labels), gpus=gpus)


def ledger_with(node_id: str, *vram: int) -> Ledger:
    """A node with 64 GiB of RAM and one VRAM domain of each size, devices 0, 1, ..."""
    ledger = Ledger()
    domains = [Domain("host.ram", RAM, 64 * GIB)]
    domains += [
        Domain(f"gpu{index}.vram", VRAM, size, device=index) for index, size in enumerate(vram)
    ]
    ledger.set_node(node_id, domains)
    return ledger


def placing(
    nodes: list[NodeCandidate],
    ledger: Ledger,
    gpu: GpuConstraints,
    *,
    claims: tuple[Claim, ...] = (Claim(RAM, GIB),),
    labels: frozenset[str] = frozenset(),
) -> Placed | NotPlaced:
    return place(
        nodes=nodes,
        ledger=ledger,
        claims=claims,
        required_labels=labels,
        replicas=1,
        exclude=(),
        policy=PlacementPolicy.BIN_PACK,
        gpu=gpu,
    )


def only_refusal(result: Placed | NotPlaced) -> tuple[str, str]:
    assert isinstance(result, NotPlaced), result
    assert len(result.node_refusals) == 1, result
    refusal = result.node_refusals[0]
    return refusal.reason, refusal.message


def test_a_gpu_of_another_model_is_refused_naming_both() -> None:
    result = placing([gpu_node("n1", A10)], ledger_with("n1", 24 * GIB), GpuConstraints("H100"))
    assert only_refusal(result) == ("NO_ELIGIBLE_NODE", "gpu model NVIDIA A10 is not H100")
    assert isinstance(result, NotPlaced) and result.reason == "NO_ELIGIBLE_NODE"
    assert "n1 NO_ELIGIBLE_NODE (gpu model NVIDIA A10 is not H100)" in result.message


def test_the_model_matches_a_part_of_the_name_whatever_its_case() -> None:
    result = placing([gpu_node("n1", H100)], ledger_with("n1", 80 * GIB), GpuConstraints("h100"))
    assert result == Placed(["n1"])


def test_a_lower_compute_capability_is_refused() -> None:
    result = placing(
        [gpu_node("n1", T4)],
        ledger_with("n1", 16 * GIB),
        GpuConstraints(min_compute_capability=(8, 0)),
    )
    assert only_refusal(result) == ("NO_ELIGIBLE_NODE", "compute capability 7.5 < 8.0")


def test_compute_capability_compares_as_numbers_not_text() -> None:
    # "12.0" sorts before "8.0" as text; as (major, minor) it is above it.
    blackwell = GpuFacts(0, "NVIDIA RTX PRO 6000", "12.0")
    result = placing(
        [gpu_node("n1", blackwell)],
        ledger_with("n1", 96 * GIB),
        GpuConstraints(min_compute_capability=(8, 9)),
    )
    assert result == Placed(["n1"])


def test_too_little_free_vram_is_refused_as_capacity_counting_what_is_charged() -> None:
    ledger = ledger_with("n1", 8 * GIB)
    ledger.charge("resident", "n1", [Claim(VRAM, int(4.8 * GIB), device=0)])
    result = placing([gpu_node("n1", A10)], ledger, GpuConstraints(min_free_vram=8 * GIB))
    assert only_refusal(result) == ("NO_CAPACITY", "free VRAM 3.2 GiB < 8.0 GiB")
    assert isinstance(result, NotPlaced) and result.reason == "NO_CAPACITY"
    ledger.release("resident")
    assert placing([gpu_node("n1", A10)], ledger, GpuConstraints(min_free_vram=8 * GIB)) == (
        Placed(["n1"])
    )


def test_missing_node_labels_are_named() -> None:
    result = placing(
        [gpu_node("n1", A10, labels=("zone=b",))],
        ledger_with("n1", 24 * GIB),
        GpuConstraints(),
        labels=frozenset({"zone=a"}),
    )
    assert only_refusal(result) == ("NO_ELIGIBLE_NODE", "missing labels: zone=a")


def test_a_node_without_a_gpu_is_refused_when_a_gpu_constraint_is_set() -> None:
    ledger = Ledger()
    ledger.set_node("cpu", [Domain("host.ram", RAM, 64 * GIB)])
    result = placing([gpu_node("cpu")], ledger, GpuConstraints("H100"))
    assert only_refusal(result) == ("NO_ELIGIBLE_NODE", "no GPU reported")
    # Without any constraint the same node takes a CPU replica.
    assert placing([gpu_node("cpu")], ledger, GpuConstraints()) == Placed(["cpu"])


def test_every_constraint_met_places_and_the_failing_node_is_passed_over() -> None:
    ledger = ledger_with("a10", 24 * GIB)
    ledger.set_node("h100", [Domain("host.ram", RAM, 64 * GIB), Domain("g", VRAM, 80 * GIB)])
    nodes = [gpu_node("a10", A10, labels=("zone=a",)), gpu_node("h100", H100, labels=("zone=a",))]
    every = GpuConstraints("H100", min_compute_capability=(8, 0), min_free_vram=40 * GIB)
    result = placing(nodes, ledger, every, labels=frozenset({"zone=a"}))
    assert result == Placed(["h100"])


def test_the_constraints_hold_on_the_gpu_the_vram_claim_names() -> None:
    # GPU 0 is an A10, GPU 1 an H100: a replica claiming VRAM on GPU 0 cannot use the H100.
    ledger = ledger_with("n1", 24 * GIB, 80 * GIB)
    gpus = (A10, GpuFacts(1, H100.name, H100.compute_capability))
    on_gpu0 = (Claim(RAM, GIB), Claim(VRAM, GIB, device=0))
    on_gpu1 = (Claim(RAM, GIB), Claim(VRAM, GIB, device=1))
    h100 = GpuConstraints("H100")
    assert only_refusal(placing([gpu_node("n1", *gpus)], ledger, h100, claims=on_gpu0)) == (
        "NO_ELIGIBLE_NODE",
        "gpu model NVIDIA A10 is not H100",
    )
    assert placing([gpu_node("n1", *gpus)], ledger, h100, claims=on_gpu1) == Placed(["n1"])
    # No VRAM claim: any GPU of the node may meet them.
    assert placing([gpu_node("n1", *gpus)], ledger, h100) == Placed(["n1"])


def test_each_gpu_is_named_when_none_meets_the_constraints() -> None:
    ledger = ledger_with("n1", 16 * GIB, 24 * GIB)
    gpus = (T4, GpuFacts(1, A10.name, A10.compute_capability))
    result = placing([gpu_node("n1", *gpus)], ledger, GpuConstraints(min_compute_capability=(9, 0)))
    assert only_refusal(result) == (
        "NO_ELIGIBLE_NODE",
        "GPU 0: compute capability 7.5 < 9.0; GPU 1: compute capability 8.6 < 9.0",
    )


def test_a_vram_domain_no_gpu_was_named_for_has_free_vram_but_no_model() -> None:
    facts = gpu_facts((), [Domain("host.ram", RAM, GIB), Domain("gpu0.vram", VRAM, GIB)])
    assert facts == (GpuFacts(0),)
    ledger = ledger_with("n1", 24 * GIB)
    assert placing([gpu_node("n1", *facts)], ledger, GpuConstraints(min_free_vram=GIB)) == (
        Placed(["n1"])
    )
    result = placing([gpu_node("n1", *facts)], ledger, GpuConstraints("A10"))
    assert only_refusal(result) == ("NO_ELIGIBLE_NODE", "gpu model unknown is not A10")


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("8.0", (8, 0)), (" 12.1 ", (12, 1)), ("", None), ("8", None), ("8.x", None), ("-1.0", None)],
)
def test_compute_capability_parsing(text: str, parsed: tuple[int, int] | None) -> None:
    assert parse_compute_capability(text) == parsed


def test_the_wire_carries_constraints_and_gpus_into_the_core() -> None:
    core = SchedulerCore()
    node = scheduler_pb2.SchedulerNode(
        node_id="n1",
        state=common_pb2.NODE_STATE_CONNECTED,
        labels=["device:cuda", "zone=a"],
        domains=[
            common_pb2.ResourceDomain(
                name="host.ram", kind=common_pb2.RESOURCE_KIND_RAM, capacity_bytes=64 * GIB
            ),
            common_pb2.ResourceDomain(
                name="gpu0.vram", kind=common_pb2.RESOURCE_KIND_VRAM, capacity_bytes=24 * GIB
            ),
        ],
        gpus=[common_pb2.GpuDevice(device=0, name="NVIDIA A10", compute_capability="8.6")],
    )
    info: NodeInfo = wire.node(node)
    assert info.gpus == (A10,)
    assert wire._node_view(info).gpus == node.gpus
    core.load_cluster(nodes=[info], residencies=[], deployments=[], policies=[], now=0.0)

    def request(**constraints: object) -> scheduler_pb2.PlaceDeployment:
        return scheduler_pb2.PlaceDeployment(
            request_id="r",
            deployment_id="d",
            replicas=1,
            constraints=common_pb2.PlacementConstraints(**constraints),  # type: ignore[arg-type]
        )

    refused = core.place(wire.placement(request(gpu_model="H100", node_labels=["zone=a"])), 0.0)
    assert isinstance(refused, PlacementRefused), refused
    assert refused.reason == "NO_ELIGIBLE_NODE"
    assert "gpu model NVIDIA A10 is not H100" in refused.message
    refused = core.place(wire.placement(request(node_labels=["zone=b"])), 0.0)
    assert isinstance(refused, PlacementRefused) and "missing labels: zone=b" in refused.message
    made = core.place(
        wire.placement(
            request(gpu_model="a10", min_compute_capability="8.0", node_labels=["zone=a"])
        ),
        0.0,
    )
    assert isinstance(made, PlacementMade) and made.node_ids == ("n1",)

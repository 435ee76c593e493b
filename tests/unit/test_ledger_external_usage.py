"""GPU memory held by processes Gantry did not start, in the scheduler (policy/ledger.py): charged
against the device's VRAM domain beside every holder, so placement refuses a node it leaves too
little, naming it; it is replaced by each announcement of the node, and never counted as held."""

from __future__ import annotations

from gantry.scheduler import wire
from gantry.scheduler.policy.core import SchedulerCore
from gantry.scheduler.policy.events import PlacementRefused, PlacementRequest
from gantry.scheduler.policy.ledger import Fit, Ledger
from gantry.scheduler.policy.types import Claim, Domain, PlacementPolicy, ResourceKind
from gantry.v1 import common_pb2, scheduler_pb2

GIB = 1 << 30
RAM, VRAM, UNIFIED = ResourceKind.RAM, ResourceKind.VRAM, ResourceKind.UNIFIED
DOMAINS = [
    Domain("host.ram", RAM, 64 * GIB),
    Domain("gpu0.vram", VRAM, 24 * GIB, margin=2 * GIB, device=0),
]
ENVELOPE = [Claim(RAM, GIB), Claim(VRAM, 8 * GIB, device=0)]


def test_external_usage_lowers_what_a_device_has_available_and_is_named_in_a_refusal():
    ledger = Ledger()
    ledger.set_node("n", DOMAINS, external=[Claim(VRAM, 18 * GIB, device=0)])
    assert ledger.fits("n", ENVELOPE) == Fit(
        False,
        "NO_CAPACITY",
        "gpu0.vram needs 8.0 GiB, 4.0 GiB available"
        " (18.0 GiB held by GPU processes Gantry did not start)",
    )
    assert ledger.fits("n", [Claim(VRAM, 4 * GIB, device=0)]).ok
    views = {view.domain.name: view for view in ledger.views()}
    assert (views["gpu0.vram"].available, views["gpu0.vram"].reserved) == (4 * GIB, 0)
    assert views["host.ram"].available == 64 * GIB  # another domain is untouched


def test_it_is_never_part_of_what_holders_hold_and_each_announcement_replaces_it():
    ledger = Ledger()
    ledger.set_node("n", DOMAINS, external=[Claim(VRAM, 10 * GIB, device=0)])
    ledger.charge("r1", "n", ENVELOPE)
    assert ledger.reserved("n", "gpu0.vram") == 8 * GIB
    assert ledger.recomputed_reserved()[("n", "gpu0.vram")] == 8 * GIB
    assert not ledger.fits("n", ENVELOPE).ok  # 22 - 10 - 8 = 4 GiB left
    ledger.set_node("n", DOMAINS)  # the external process let go of its memory
    assert ledger.fits("n", ENVELOPE).ok
    assert ledger.reserved("n", "gpu0.vram") == 8 * GIB  # the holder's charge stayed


def test_it_charges_the_domain_its_device_resolves_to_and_nothing_without_one():
    unified = Ledger()
    unified.set_node(
        "m", [Domain("soc", UNIFIED, 32 * GIB)], external=[Claim(VRAM, 30 * GIB, device=0)]
    )
    assert not unified.fits("m", [Claim(RAM, 4 * GIB)]).ok  # one pool: RAM feels it too
    other_gpu = Ledger()
    other_gpu.set_node("n", DOMAINS, external=[Claim(VRAM, 20 * GIB, device=1)])
    assert other_gpu.fits("n", ENVELOPE).ok  # device 1 has no domain here: nothing to charge


def test_placement_refuses_the_node_an_announcement_says_is_taken():
    core = SchedulerCore()
    announced = scheduler_pb2.SchedulerNode(
        node_id="gpu",
        state=common_pb2.NODE_STATE_CONNECTED,
        labels=["device:cuda"],
        domains=[wire._domain(d) for d in DOMAINS],
        external_usage=[
            common_pb2.ResourceClaim(kind=common_pb2.RESOURCE_KIND_VRAM, bytes=18 * GIB, device=0)
        ],
    )
    node = wire.node(announced)
    assert node.external == (Claim(VRAM, 18 * GIB, device=0),)
    assert list(wire._node_view(node).external_usage) == list(announced.external_usage)
    core.upsert_node(node, now=0.0)
    request = PlacementRequest(
        request_id="p1",
        deployment_id="d1",
        replicas=1,
        claims=tuple(ENVELOPE),
        required_labels=frozenset({"device:cuda"}),
        policy=PlacementPolicy.BIN_PACK,
    )
    refused = core.place(request, now=0.0)
    assert isinstance(refused, PlacementRefused) and refused.reason == "NO_CAPACITY"
    assert "18.0 GiB held by GPU processes Gantry did not start" in refused.node_refusals[0].message

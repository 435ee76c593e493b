"""What nodes offer placement and what deployments ask of it: labels from a node's inventory (its
adapters, the modalities and environments they run in), a deployment's labels (its adapter, the
modality that takes, its profile's environment) and claims from its profile's envelope, and how
the Announcer sends both."""

from __future__ import annotations

import datetime as dt

import pytest
from google.protobuf import json_format

from gantry.common.clock import ManualClock
from gantry.common.errors import GantryError
from gantry.controlplane.deployments.requirements import (
    DEFAULT_SLOTS,
    NOTHING_CHARGED,
    ResidencyCharge,
    cuda_device,
    placement_policy,
    refusal_message,
    required_labels,
    residency_charge,
)
from gantry.controlplane.evidence.adapter_modalities import ADAPTER_MODALITIES, modality_of
from gantry.controlplane.evidence.envelope import profile_envelope, vram_with_margin
from gantry.controlplane.nodes.capabilities import domains_from_json, domains_to_json
from gantry.controlplane.platform.announcer import Announcer, scheduler_node, scheduler_residency
from gantry.controlplane.platform.models import Node, Residency, RuntimeProfile
from gantry.controlplane.platform.scheduler_link import PlacementRefused
from gantry.controlplane.platform.validation import SUPPORTED_ADAPTERS
from gantry.controlplane.serving.route_cache import RouteCache
from gantry.v1 import common_pb2, scheduler_pb2
from gantry.v1 import worker_gateway_pb2 as wg

GIB = 1 << 30
RAM = common_pb2.RESOURCE_KIND_RAM
VRAM = common_pb2.RESOURCE_KIND_VRAM
HOST_RAM = common_pb2.ResourceDomain(name="host.ram", kind=RAM, capacity_bytes=64 * GIB)
GPU0 = common_pb2.ResourceDomain(name="gpu0.vram", kind=VRAM, capacity_bytes=80 * GIB)
UNIFIED = common_pb2.ResourceDomain(
    name="unified", kind=common_pb2.RESOURCE_KIND_UNIFIED, capacity_bytes=128 * GIB
)


def _inventory(
    *domains: common_pb2.ResourceDomain,
    adapters: tuple[str, ...] = ("sentence_transformers",),
    environments: tuple[wg.RuntimeEnvironment, ...] = (),
) -> dict[str, object]:
    """A node's inventory as the gateway stores it from a Hello."""
    return {
        "adapters": sorted(adapters),
        "domains": domains_to_json(domains),
        "environments": [json_format.MessageToDict(e) for e in environments],
    }


def _labels(inventory: dict[str, object]) -> list[str]:
    return list(scheduler_node("n", 1, inventory, ["n"]).labels)


# ---- node labels ------------------------------------------------------------------------------


def test_a_cpu_node_carries_its_adapters_and_the_cpu() -> None:
    inventory = _inventory(
        HOST_RAM, adapters=("sentence_transformers", "sentence_transformers_cross_encoder")
    )
    assert _labels(inventory) == [
        "adapter:sentence_transformers",
        "adapter:sentence_transformers_cross_encoder",
        "device:cpu",
        "modality:text",
    ]


def test_a_node_with_vram_carries_cuda_and_its_gpu_model() -> None:
    environment = wg.RuntimeEnvironment(
        environment_id="default", device="cuda", device_name="NVIDIA H200", available=True
    )
    inventory = _inventory(HOST_RAM, GPU0, environments=(environment,))
    assert _labels(inventory) == [
        "adapter:sentence_transformers",
        "device:cpu",
        "device:cuda",
        "environment:default",
        "gpu.model:NVIDIA H200",
        "modality:text",
    ]


def test_a_unified_pool_is_a_gpu() -> None:
    assert "device:cuda" in _labels(_inventory(UNIFIED))


def test_a_cpu_environment_names_no_gpu_model_and_ram_alone_is_no_gpu() -> None:
    environment = wg.RuntimeEnvironment(environment_id="default", device="cpu", available=True)
    assert _labels(_inventory(HOST_RAM, environments=(environment,))) == [
        "adapter:sentence_transformers",
        "device:cpu",
        "environment:default",
        "modality:text",
    ]


def test_an_inventory_from_before_domains_still_labels_the_node() -> None:
    assert _labels({"adapters": ["sentence_transformers"]}) == [
        "adapter:sentence_transformers",
        "device:cpu",
        "modality:text",
    ]


# The two environments of a worker that maps `.venv-vision` as "vision", as their facts say.
DEFAULT_ENVIRONMENT = wg.RuntimeEnvironment(
    environment_id="default",
    adapters=[
        "sentence_transformers",
        "sentence_transformers_cross_encoder",
        "transformers_whisper",
    ],
    modalities=["audio", "text"],
    available=True,
)
VISION_ENVIRONMENT = wg.RuntimeEnvironment(
    environment_id="vision",
    adapters=["transformers_siglip2", "transformers_trocr", "transformers_whisper"],
    modalities=["audio", "image"],
    available=True,
)


def _inventory_of(*environments: wg.RuntimeEnvironment) -> dict[str, object]:
    adapters = {a for environment in environments for a in environment.adapters}
    return _inventory(HOST_RAM, adapters=tuple(adapters), environments=environments)


def test_a_node_carries_the_modalities_and_environments_of_its_environments() -> None:
    assert _labels(_inventory_of(DEFAULT_ENVIRONMENT, VISION_ENVIRONMENT)) == [
        "adapter:sentence_transformers",
        "adapter:sentence_transformers_cross_encoder",
        "adapter:transformers_siglip2",
        "adapter:transformers_trocr",
        "adapter:transformers_whisper",
        "device:cpu",
        "environment:default",
        "environment:vision",
        "modality:audio",
        "modality:image",
        "modality:text",
    ]


def test_a_node_without_the_vision_environment_offers_no_image_input() -> None:
    labels = _labels(_inventory_of(DEFAULT_ENVIRONMENT))
    assert "modality:image" not in labels and "environment:vision" not in labels
    assert {"modality:audio", "modality:text", "environment:default"} <= set(labels)


def test_an_unavailable_environment_offers_nothing() -> None:
    broken = wg.RuntimeEnvironment(
        environment_id="vision", available=False, unavailable_reason="cannot run it"
    )
    labels = _labels(_inventory_of(DEFAULT_ENVIRONMENT, broken))
    assert "environment:vision" not in labels and "modality:image" not in labels


def test_declared_modalities_count_even_for_an_adapter_the_control_plane_does_not_know() -> None:
    newer = wg.RuntimeEnvironment(
        environment_id="video",
        adapters=["some_video_adapter"],
        modalities=["video"],
        available=True,
    )
    labels = _labels(_inventory_of(newer))
    assert {"adapter:some_video_adapter", "environment:video", "modality:video"} <= set(labels)


def test_the_scheduler_hears_the_domains_the_hello_declared() -> None:
    newer_kind = common_pb2.ResourceDomain(name="npu0", kind=7, capacity_bytes=GIB)  # type: ignore[arg-type]
    declared = [HOST_RAM, GPU0, newer_kind]
    node = scheduler_node("n", 3, _inventory(*declared), ["n"])
    assert list(node.domains) == declared  # an unknown kind is kept, for the scheduler to refuse
    assert domains_from_json(domains_to_json(declared)) == declared
    assert domains_to_json([GPU0]) == [
        {
            "name": "gpu0.vram",
            "kind": "VRAM",
            "capacity_bytes": 80 * GIB,
            "safety_margin_bytes": 0,
            "device": 0,
        }
    ]


# ---- what a deployment asks -------------------------------------------------------------------


def _profile(
    *, ram: int, vram: int, ram_peak: int | None = None, vram_peak: int | None = None
) -> RuntimeProfile:
    return RuntimeProfile(
        ram_estimate_bytes=ram,
        vram_estimate_bytes=vram,
        ram_measured_peak_bytes=ram_peak,
        vram_measured_peak_bytes=vram_peak,
    )


def _claims(charge: ResidencyCharge) -> list[tuple[int, int, int]]:
    return [(c.kind, c.bytes, c.device) for c in charge.claims()]


def test_a_cpu_model_claims_ram_only_even_with_a_vram_estimate() -> None:
    envelope = profile_envelope(_profile(ram=GIB, vram=2 * GIB, ram_peak=3 * GIB))
    charge = residency_charge(common_pb2.AdapterSettings(device="cpu"), envelope)
    assert _claims(charge) == [(RAM, 3 * GIB, 0)]


def test_a_cuda_model_claims_ram_and_the_vram_of_its_gpu() -> None:
    envelope = profile_envelope(_profile(ram=GIB, vram=4 * GIB, vram_peak=6 * GIB))
    on_default = residency_charge(common_pb2.AdapterSettings(device="cuda"), envelope)
    on_second = residency_charge(common_pb2.AdapterSettings(device="cuda:2"), envelope)
    vram = vram_with_margin(6 * GIB)  # the measured peak, with its margin
    assert _claims(on_default) == [(RAM, GIB, 0), (VRAM, vram, 0)]
    assert _claims(on_second) == [(RAM, GIB, 0), (VRAM, vram, 2)]


def test_a_cuda_model_with_no_vram_in_its_envelope_claims_ram_only() -> None:
    charge = residency_charge(common_pb2.AdapterSettings(device="cuda:1"), (GIB, 0))
    assert _claims(charge) == [(RAM, GIB, 0)]


def test_slots_are_the_adapters_concurrency_or_the_default() -> None:
    assert residency_charge(common_pb2.AdapterSettings(), (0, 0)).slots == DEFAULT_SLOTS == 32
    batched = residency_charge(common_pb2.AdapterSettings(max_batch_size=16), (0, 0))
    assert batched.slots == 16
    bounded = residency_charge(
        common_pb2.AdapterSettings(max_concurrency=9, max_batch_size=16), (0, 0)
    )
    assert bounded.slots == 9


@pytest.mark.parametrize(
    ("device", "index"), [("", None), ("cpu", None), ("cuda", 0), ("cuda:0", 0), ("cuda:3", 3)]
)
def test_the_gpu_of_a_device_string(device: str, index: int | None) -> None:
    assert cuda_device(device) == index


def test_a_gpu_model_needs_a_cuda_node_with_its_adapter() -> None:
    cross_encoder = common_pb2.AdapterSettings(adapter="sentence_transformers_cross_encoder")
    assert required_labels(cross_encoder) == [
        "adapter:sentence_transformers_cross_encoder",
        "modality:text",
    ]
    on_gpu = common_pb2.AdapterSettings(adapter="sentence_transformers", device="cuda:1")
    assert required_labels(on_gpu) == [
        "adapter:sentence_transformers",
        "modality:text",
        "device:cuda",
    ]


@pytest.mark.parametrize(
    ("adapter", "modality"),
    [
        ("sentence_transformers", "text"),
        ("", "text"),  # the default adapter
        ("sentence_transformers_cross_encoder", "text"),
        ("transformers_whisper", "audio"),
        ("transformers_trocr", "image"),
        ("transformers_siglip2", "image"),
    ],
)
def test_a_deployment_needs_the_modality_its_adapter_takes(adapter: str, modality: str) -> None:
    assert modality_of(adapter) == modality
    labels = required_labels(common_pb2.AdapterSettings(adapter=adapter))
    assert f"modality:{modality}" in labels
    assert set(ADAPTER_MODALITIES) == SUPPORTED_ADAPTERS  # one table for both


def test_a_deployment_needs_the_environment_its_profile_names_unless_the_default() -> None:
    siglip2 = common_pb2.AdapterSettings(adapter="transformers_siglip2")
    assert required_labels(siglip2, environment_id="vision") == [
        "adapter:transformers_siglip2",
        "modality:image",
        "environment:vision",
    ]
    for default in ("", "default"):
        assert not any(
            label.startswith("environment:")
            for label in required_labels(siglip2, environment_id=default)
        )
    assert modality_of("vllm") is None
    assert required_labels(common_pb2.AdapterSettings(adapter="vllm")) == ["adapter:vllm"]


def test_an_image_deployment_fits_the_vision_node_and_not_the_text_one() -> None:
    # The placement gate is a subset test (scheduler.policy.placement): what is missing is named.
    needed = set(
        required_labels(
            common_pb2.AdapterSettings(adapter="transformers_trocr"), environment_id="vision"
        )
    )
    vision_node = set(_labels(_inventory_of(DEFAULT_ENVIRONMENT, VISION_ENVIRONMENT)))
    text_node = set(_labels(_inventory_of(DEFAULT_ENVIRONMENT)))
    assert needed <= vision_node
    assert sorted(needed - text_node) == [
        "adapter:transformers_trocr",
        "environment:vision",
        "modality:image",
    ]


def test_the_stored_placement_policy_on_the_wire() -> None:
    assert placement_policy("BIN_PACK") == common_pb2.PLACEMENT_POLICY_BIN_PACK
    assert placement_policy("SPREAD") == common_pb2.PLACEMENT_POLICY_SPREAD
    assert placement_policy("") == common_pb2.PLACEMENT_POLICY_BIN_PACK


# ---- a refused placement ----------------------------------------------------------------------


def _refusal(node_id: str, reason: str, message: str) -> scheduler_pb2.NodeRefusal:
    return scheduler_pb2.NodeRefusal(node_id=node_id, reason=reason, message=message)


def test_a_refusal_names_every_node_and_its_reason_by_node_id() -> None:
    refusals = [
        _refusal("node-b", "NO_ELIGIBLE_NODE", "missing labels: device:cuda"),
        _refusal("node-a", "NO_CAPACITY", "host.ram needs 2.0 GiB, 1.0 GiB available"),
    ]
    assert refusal_message("0 of 2 nodes can take it", refusals) == (
        "none of 2 nodes can take it: node-a NO_CAPACITY (host.ram needs 2.0 GiB, 1.0 GiB "
        "available); node-b NO_ELIGIBLE_NODE (missing labels: device:cuda)"
    )
    assert refusal_message("no node is connected", []) == "no node is connected"


def test_a_refusal_of_many_nodes_lists_some_and_counts_the_rest() -> None:
    refusals = [_refusal(f"node-{i:02d}", "NO_CAPACITY", "full") for i in range(5)]
    message = refusal_message("", refusals, listed=2)
    assert message == (
        "none of 5 nodes can take it: node-00 NO_CAPACITY (full); node-01 NO_CAPACITY (full); "
        "and 3 more"
    )


def test_a_rejected_placement_keeps_its_reason_and_carries_the_node_refusals() -> None:
    rejected = scheduler_pb2.Rejected(
        work_id="request-1",
        failure=GantryError("NO_CAPACITY", "0 of 1 nodes can take it").to_failure(),
        node_refusals=[_refusal("node-a", "NO_CAPACITY", "full")],
    )
    refused = PlacementRefused(rejected)
    assert isinstance(refused, GantryError)
    assert (refused.reason, refused.message) == ("NO_CAPACITY", "0 of 1 nodes can take it")
    assert [r.node_id for r in refused.node_refusals] == ["node-a"]


# ---- announcements ----------------------------------------------------------------------------


class RecordingLink:
    """The calls of SchedulerLink an Announcer makes for residencies and nodes."""

    def __init__(self) -> None:
        self.residencies: list[scheduler_pb2.SchedulerResidency] = []
        self.resyncs: list[str] = []
        self.nodes: list[scheduler_pb2.SchedulerNode] = []
        self.removed_nodes: list[str] = []

    def node_changed(self, node: scheduler_pb2.SchedulerNode) -> None:
        self.nodes.append(node)

    def node_removed(self, node_id: str) -> None:
        self.removed_nodes.append(node_id)

    def residency_changed(self, residency: scheduler_pb2.SchedulerResidency) -> None:
        self.residencies.append(residency)

    def resynchronise(self, why: str) -> None:
        self.resyncs.append(why)


def _residency(state: str, deployment_id: str = "d1") -> Residency:
    return Residency(
        residency_id=f"r-{state.lower()}",
        deployment_id=deployment_id,
        node_id="n1",
        state=state,
        updated_at=dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
    )


def _announcer() -> tuple[Announcer, RecordingLink]:
    link = RecordingLink()
    announcer = Announcer(scheduler=link, routes=RouteCache(ManualClock()))  # type: ignore[arg-type]
    return announcer, link


def test_a_residency_is_announced_with_its_claims_and_slots() -> None:
    charge = residency_charge(common_pb2.AdapterSettings(device="cuda:1"), (GIB, 2 * GIB))
    message = scheduler_residency(_residency("RESIDENT"), charge)
    assert [(c.kind, c.bytes, c.device) for c in message.claims] == [
        (RAM, GIB, 0),
        (VRAM, 2 * GIB, 1),
    ]
    assert message.slots == DEFAULT_SLOTS
    assert message.state == common_pb2.RESIDENCY_STATE_RESIDENT


def test_an_announced_residency_carries_the_charge_its_deployment_was_read_with() -> None:
    announcer, link = _announcer()
    charge = residency_charge(common_pb2.AdapterSettings(max_concurrency=2), (3 * GIB, 0))
    announcer.learn_charges({"d1": charge})
    announcer.residencies([_residency("LOADING")])
    (sent,) = link.residencies
    assert [(c.kind, c.bytes) for c in sent.claims] == [(RAM, 3 * GIB)]
    assert sent.slots == 2
    assert link.resyncs == []


def test_a_residency_whose_charge_is_unknown_asks_for_a_snapshot_instead_of_going_bare() -> None:
    announcer, link = _announcer()
    announcer.residencies([_residency("RESIDENT", deployment_id="unread")])
    assert link.residencies == []
    assert link.resyncs == ["the charge of deployment unread is not known here yet"]


def test_a_cold_residency_charges_nothing_so_it_goes_out_even_unread() -> None:
    announcer, link = _announcer()
    announcer.residencies([_residency("COLD", deployment_id="unread")])
    (sent,) = link.residencies
    assert sent.state == common_pb2.RESIDENCY_STATE_COLD
    assert list(sent.claims) == NOTHING_CHARGED.claims()
    assert link.resyncs == []


def test_a_deleted_node_is_announced_removed_whoever_announces_it() -> None:
    announcer, link = _announcer()
    row = Node(node_id="n1", name="left", state="DISCONNECTED", generation=1, inventory={})
    announcer.node(row, ())
    assert [n.node_id for n in link.nodes] == ["n1"] and link.removed_nodes == []
    # Deleted; then the goodbye of the stream the delete closed announces it once more.
    row.deleted_at = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    announcer.node(row, ())
    announcer.node(row, ())
    assert link.removed_nodes == ["n1", "n1"] and len(link.nodes) == 1

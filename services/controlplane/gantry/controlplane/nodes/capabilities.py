"""What a node offers placement: its resource domains as the inventory stores them, and the
capability labels derived from its last Hello. Pure.

Labels are derived, never stored, so they always follow the stored inventory: `adapter:<name>` per
adapter its environments support, `modality:<m>` per input those adapters take (what the
environments declared, and what the control plane's table says of each adapter: an inventory
stored before environments declared modalities still offers them), `environment:<id>` per
environment its worker reported available, `device:cpu` always, `device:cuda` when it declares a
VRAM or unified domain, and `gpu.model:<name>` for each GPU model its environments reported.
Beside them placement sees `key=value` for each label the operator registered the node with
(`registered_labels`, from the node's row, not its Hello). A label is a hint for placement, never a
security property. The GPUs its worker's NVML named (model, compute capability) travel beside the
labels: a placement constraint compares them, not a label.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gantry.common.node_labels import placement_label
from gantry.controlplane.evidence.adapter_modalities import modality_of
from gantry.v1 import common_pb2

ADAPTER_PREFIX = "adapter:"
MODALITY_PREFIX = "modality:"
ENVIRONMENT_PREFIX = "environment:"
DEFAULT_ENVIRONMENT_ID = "default"  # how workers name the environment an empty id means
DEVICE_CPU = "device:cpu"
DEVICE_CUDA = "device:cuda"
GPU_MODEL_PREFIX = "gpu.model:"

_KIND_PREFIX = "RESOURCE_KIND_"
_GPU_KINDS = frozenset({common_pb2.RESOURCE_KIND_VRAM, common_pb2.RESOURCE_KIND_UNIFIED})


def adapter_label(adapter: str) -> str:
    return f"{ADAPTER_PREFIX}{adapter}"


def modality_label(modality: str) -> str:
    return f"{MODALITY_PREFIX}{modality}"


def environment_label(environment_id: str) -> str:
    return f"{ENVIRONMENT_PREFIX}{environment_id or DEFAULT_ENVIRONMENT_ID}"


def domains_to_json(domains: Iterable[common_pb2.ResourceDomain]) -> list[dict[str, Any]]:
    """The inventory's "domains": one plain dict per domain, its kind by name ("RAM") like every
    stored enum, or the number of a kind this control plane does not know (kept, to be refused
    by the scheduler, never read as another kind)."""
    return [
        {
            "name": domain.name,
            "kind": _kind_name(domain.kind),
            "capacity_bytes": domain.capacity_bytes,
            "safety_margin_bytes": domain.safety_margin_bytes,
            "device": domain.device,
        }
        for domain in domains
    ]


def domains_from_json(stored: Sequence[Mapping[str, Any]]) -> list[common_pb2.ResourceDomain]:
    return [
        common_pb2.ResourceDomain(
            name=str(entry.get("name", "")),
            kind=_kind_value(entry.get("kind", 0)),
            capacity_bytes=int(entry.get("capacity_bytes", 0)),
            safety_margin_bytes=int(entry.get("safety_margin_bytes", 0)),
            device=int(entry.get("device", 0)),
        )
        for entry in stored
    ]


def node_labels(inventory: Mapping[str, Any]) -> list[str]:
    """The capability labels of a node, sorted, from its stored inventory."""
    labels = {DEVICE_CPU}
    adapters = [str(name) for name in inventory.get("adapters", [])]
    labels.update(adapter_label(name) for name in adapters)
    modalities = {modality_of(name) for name in adapters}
    if any(d.kind in _GPU_KINDS for d in domains_from_json(inventory.get("domains", []))):
        labels.add(DEVICE_CUDA)
    for environment in inventory.get("environments", []):
        # Stored with MessageToDict's names ("deviceName", "environmentId"), empty fields left
        # out: an unavailable environment has no "available" and no adapters.
        if environment.get("available") is True:
            labels.add(environment_label(str(environment.get("environmentId", ""))))
            modalities.update(str(m) for m in environment.get("modalities", []))
        model = str(environment.get("deviceName", "")).strip()
        if environment.get("device") == "cuda" and model:
            labels.add(f"{GPU_MODEL_PREFIX}{model}")
    labels.update(modality_label(m) for m in modalities if m)
    return sorted(labels)


def registered_labels(labels: Mapping[str, str]) -> list[str]:
    """The labels a node was registered with, as placement compares them (`zone=a`)."""
    return [placement_label(key, value) for key, value in labels.items()]


def gpus_to_json(gpus: Iterable[common_pb2.GpuDevice]) -> list[dict[str, Any]]:
    """The inventory's "gpu_devices" (its "gpus" is the last heartbeat's reading): each GPU its
    worker's NVML named at start, as a plain dict."""
    return [
        {"device": g.device, "name": g.name, "compute_capability": g.compute_capability}
        for g in gpus
    ]


def gpus_from_json(stored: Sequence[Mapping[str, Any]]) -> list[common_pb2.GpuDevice]:
    """What `gpus_to_json` stored (nothing for an inventory stored before GPUs were named)."""
    return [
        common_pb2.GpuDevice(
            device=int(entry.get("device", 0)),
            name=str(entry.get("name", "")),
            compute_capability=str(entry.get("compute_capability", "")),
        )
        for entry in stored
    ]


def _kind_name(kind: int) -> str | int:
    if kind in common_pb2.ResourceKind.values():
        return common_pb2.ResourceKind.Name(kind).removeprefix(_KIND_PREFIX)
    return kind


def _kind_value(stored: object) -> common_pb2.ResourceKind:
    if isinstance(stored, int):
        return stored  # type: ignore[return-value]  # an open enum: any number is a value
    return common_pb2.ResourceKind.Value(f"{_KIND_PREFIX}{stored}")

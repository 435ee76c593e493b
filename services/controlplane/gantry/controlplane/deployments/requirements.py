"""What a deployment asks of placement: the labels a node must carry (its adapter, the input that
adapter takes, the environment its profile names, a GPU), what each replica charges there (its
envelope and its slots), and the policy that picks among the nodes that fit. Pure.

Every replica of a deployment charges the same: RAM always (the profile's envelope, which may be
0 bytes for a deployment made before profiles and then charges nothing), and VRAM on the GPU its
adapter names when it runs on CUDA. A CUDA deployment whose envelope holds no VRAM is not placed
at all (`unmeasured_vram`): unknown is not zero.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from gantry.common.errors import GantryError, invalid_argument
from gantry.common.node_labels import label_problem
from gantry.controlplane.evidence.adapter_modalities import modality_of
from gantry.controlplane.nodes.capabilities import (
    DEFAULT_ENVIRONMENT_ID,
    DEVICE_CUDA,
    adapter_label,
    environment_label,
    modality_label,
)
from gantry.v1 import common_pb2, scheduler_pb2

# Calls a model host takes at once when its adapter sets neither max_concurrency nor
# max_batch_size: the model host's own default batch bound, so a whole batch can form in it
# (fewer slots would cap its micro-batches and its throughput).
DEFAULT_SLOTS = 32
# A refusal recorded on a deployment names this many nodes, then counts the rest.
REFUSALS_LISTED = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class ResidencyCharge:
    """What one residency of a deployment charges its node's ledger."""

    ram_bytes: int
    vram_bytes: int
    vram_device: int | None  # the GPU index; None: it runs on the CPU
    slots: int

    def claims(self) -> list[common_pb2.ResourceClaim]:
        claims = [common_pb2.ResourceClaim(kind=common_pb2.RESOURCE_KIND_RAM, bytes=self.ram_bytes)]
        if self.vram_device is not None and self.vram_bytes > 0:
            claims.append(
                common_pb2.ResourceClaim(
                    kind=common_pb2.RESOURCE_KIND_VRAM,
                    bytes=self.vram_bytes,
                    device=self.vram_device,
                )
            )
        return claims


# What a COLD residency is announced with when its deployment's charge was never read here:
# the scheduler charges nothing for a COLD residency, so nothing is lost.
NOTHING_CHARGED = ResidencyCharge(ram_bytes=0, vram_bytes=0, vram_device=None, slots=DEFAULT_SLOTS)


def cuda_device(device: str) -> int | None:
    """The GPU index of a torch device string ("cuda" is 0, "cuda:1" is 1); None off CUDA."""
    name, _, index = device.partition(":")
    if name != "cuda":
        return None
    return int(index) if index else 0


def residency_charge(
    adapter: common_pb2.AdapterSettings, envelope: tuple[int, int]
) -> ResidencyCharge:
    """The charge of a deployment with these adapter settings and this (ram, vram) envelope
    (`profile_envelope(profile)`: the larger of the estimate and the measured peak)."""
    ram_bytes, vram_bytes = envelope
    return ResidencyCharge(
        ram_bytes=ram_bytes,
        vram_bytes=vram_bytes,
        vram_device=cuda_device(adapter.device),
        slots=adapter.max_concurrency or adapter.max_batch_size or DEFAULT_SLOTS,
    )


def unmeasured_vram(charge: ResidencyCharge) -> GantryError | None:
    """VRAM_UNMEASURED for a charge on a GPU that holds no VRAM: its profile has no estimate and
    no probe measured it (`profile_envelope` is 0 only then), so placing it would charge the GPU
    nothing and let it in wherever anything is free. None when the charge can be placed."""
    if charge.vram_device is None or charge.vram_bytes > 0:
        return None
    return GantryError(
        "VRAM_UNMEASURED",
        f"the profile runs on cuda:{charge.vram_device} but its VRAM is unknown (no "
        "vram_estimate_bytes, and no probe measured its peak): probe it on a GPU node, or give "
        "a profile an estimate",
        device=f"cuda:{charge.vram_device}",
    )


def required_labels(adapter: common_pb2.AdapterSettings, *, environment_id: str = "") -> list[str]:
    """A node must support the adapter and the input it takes (`modality:image` for an image
    adapter), offer the environment the profile names when it names one besides the default,
    and hold a GPU for a model that runs on one.

    The default environment is not required by label: every worker offers one, and inventories
    stored before environments reported availability would otherwise refuse every deployment.
    """
    labels = [adapter_label(adapter.adapter)]
    modality = modality_of(adapter.adapter)
    if modality is not None:
        labels.append(modality_label(modality))
    if environment_id not in ("", DEFAULT_ENVIRONMENT_ID):
        labels.append(environment_label(environment_id))
    if cuda_device(adapter.device) is not None:
        labels.append(DEVICE_CUDA)
    return labels


def placement_policy(stored: str) -> common_pb2.PlacementPolicy:
    """The wire policy of a deployment's stored one ("BIN_PACK", "SPREAD"; "" is BIN_PACK)."""
    return common_pb2.PlacementPolicy.Value(f"PLACEMENT_POLICY_{stored or 'BIN_PACK'}")


def refusal_message(
    summary: str, refusals: Sequence[scheduler_pb2.NodeRefusal], *, listed: int = REFUSALS_LISTED
) -> str:
    """What a deployment records when no node takes it: each node's reason, by node id."""
    if not refusals:
        return summary
    ordered = sorted(refusals, key=lambda refusal: refusal.node_id)
    parts = [f"{r.node_id} {r.reason} ({r.message})" for r in ordered[:listed]]
    if len(ordered) > listed:
        parts.append(f"and {len(ordered) - listed} more")
    return f"none of {len(ordered)} nodes can take it: {'; '.join(parts)}"


# A compute capability as NVML gives it: major.minor ("8.0", "12.1").
_COMPUTE_CAPABILITY = re.compile(r"\d{1,2}\.\d{1,2}")
_GPU_MODEL_CHARS = 128


def checked_constraints(message: common_pb2.PlacementConstraints) -> dict[str, Any]:
    """An operator's placement constraints as a deployment stores them, refused INVALID_ARGUMENT
    (naming the field) when one could never be compared: a model name that is blank or too long,
    a compute capability not "major.minor", a node label outside the label rule."""
    model = message.gpu_model.strip()
    if (message.gpu_model and not model) or len(model) > _GPU_MODEL_CHARS:
        raise invalid_argument(
            f"constraints.gpu_model must be 1 to {_GPU_MODEL_CHARS} characters of a GPU's name",
            field="constraints.gpu_model",
        )
    if message.min_compute_capability and not _COMPUTE_CAPABILITY.fullmatch(
        message.min_compute_capability
    ):
        raise invalid_argument(
            f"constraints.min_compute_capability {message.min_compute_capability[:32]!r} is not "
            'major.minor (e.g. "8.0")',
            field="constraints.min_compute_capability",
        )
    problem = label_problem(list(message.node_labels))
    if problem:
        raise invalid_argument(
            f"constraints.node_labels: {problem}", field="constraints.node_labels"
        )
    checked = common_pb2.PlacementConstraints()
    checked.CopyFrom(message)
    checked.gpu_model = model
    return constraints_to_json(checked)


def constraints_to_json(message: common_pb2.PlacementConstraints) -> dict[str, Any]:
    return json_format.MessageToDict(message)


def constraints_from_json(stored: Mapping[str, Any] | None) -> common_pb2.PlacementConstraints:
    """A deployment's stored constraints ({} or NULL: none)."""
    return json_format.ParseDict(
        dict(stored or {}), common_pb2.PlacementConstraints(), ignore_unknown_fields=True
    )

"""The node's resource domains, as its Hello declares them: parsed from `--resource-domain` flags
or measured, and validated as a whole.

A declaration that leaves this module is valid: names are unique, there is at most one RAM domain,
at most one VRAM domain per GPU (named `gpuN.vram` after its device), a unified pool stands alone,
and every margin is below its capacity. The worker refuses to start on anything else, so the
scheduler's ledger never has to guess which domain a claim charges.

Parsing and validation are pure and shared with `gantry up`: they live in
gantry.common.resource_declaration and are re-exported here. Measuring the defaults reads the
machine (its memory, and the GPUs through the NVML seam): those readings come in as arguments,
never as stand-in numbers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path

import psutil

from gantry.common.resource_declaration import (
    FLAG,
    FLAG_FORMAT,
    DeclaredDomain,
    DomainKind,
    ResourceDomainError,
    human_bytes,
    parse_declaration,
    parse_domain,
    parse_margin,
    parse_size,
    validate_declaration,
)
from gantry.v1 import common_pb2
from gantry.worker.nvml_readings import Nvml, visible_devices

__all__ = [
    "DEFAULT_MARGIN_PERCENT",
    "FLAG",
    "FLAG_FORMAT",
    "HOST_RAM",
    "DeclaredDomain",
    "DomainKind",
    "ResourceDomainError",
    "gpu_count",
    "gpu_devices",
    "human_bytes",
    "machine_memory_bytes",
    "measure_node_domains",
    "measured_domains",
    "parse_declaration",
    "parse_domain",
    "parse_margin",
    "parse_size",
    "validate_declaration",
]

log = logging.getLogger(__name__)

DEFAULT_MARGIN_PERCENT = Decimal(10)
HOST_RAM = "host.ram"


# ---- measured defaults ------------------------------------------------------------------------


def measured_domains(
    *,
    total_memory_bytes: int,
    nvml: Nvml,
    visible_devices: str | None,
    warn: Callable[[str], None] = log.warning,
) -> tuple[DeclaredDomain, ...]:
    """The declaration when no flag gives one: `host.ram` (the machine's memory) and one
    `gpuN.vram` per GPU NVML reads, each with a 10 % margin. A GPU NVML cannot read gets no
    domain (placement then cannot put a CUDA model there), and `warn` says why, once."""
    domains = [_measured(HOST_RAM, DomainKind.RAM, total_memory_bytes)]
    count, why_none = gpu_count(nvml, visible_devices)
    if why_none:
        warn(f"no VRAM domain declared: {why_none}")
    for index in range(count):
        total, _ = nvml.device_memory(f"cuda:{index}", visible_devices)
        if total.WhichOneof("value") != "bytes" or total.bytes <= 0:
            warn(f"no VRAM domain for GPU {index}: {total.unavailable or 'NVML read 0 bytes'}")
            continue
        domains.append(_measured(f"gpu{index}.vram", DomainKind.VRAM, total.bytes, device=index))
    return validate_declaration(domains)


def measure_node_domains(env: Mapping[str, str]) -> tuple[DeclaredDomain, ...]:
    """`measured_domains` of this machine: its memory, and its GPUs through a fresh NVML."""
    nvml = Nvml.open()
    try:
        return measured_domains(
            total_memory_bytes=machine_memory_bytes(),
            nvml=nvml,
            visible_devices=visible_devices(env),
        )
    finally:
        nvml.close()


def gpu_devices(
    nvml: Nvml, visible_devices: str | None, warn: Callable[[str], None] = log.warning
) -> tuple[common_pb2.GpuDevice, ...]:
    """Each GPU a CUDA process started here sees, with the name and compute capability NVML
    gives it (the Hello's `gpus`: placement constraints match them). A GPU NVML cannot name is
    left out and `warn` says why: a constraint on its model then refuses it, never guesses."""
    count, _ = gpu_count(nvml, visible_devices)
    devices = []
    for index in range(count):
        name, capability, why = nvml.device_identity(index, visible_devices)
        if why:
            warn(f"GPU {index} is not named in the Hello: {why}")
            continue
        devices.append(common_pb2.GpuDevice(device=index, name=name, compute_capability=capability))
    return tuple(devices)


def gpu_count(nvml: Nvml, visible_devices: str | None) -> tuple[int, str]:
    """(GPUs a CUDA process started here sees, "") or (0, why it sees none)."""
    if not nvml.available:
        return 0, nvml.unavailable_reason
    if visible_devices is not None:
        # CUDA's own rule: set but empty hides every GPU; otherwise the listed ones, in order.
        visible = [entry for entry in visible_devices.split(",") if entry.strip()]
        if not visible:
            return 0, "CUDA_VISIBLE_DEVICES is empty"
        return len(visible), ""
    count, why = nvml.device_count()
    if count == 0 and not why:
        why = "NVML lists no GPU"
    return count, why


def _measured(name: str, kind: DomainKind, capacity: int, *, device: int = 0) -> DeclaredDomain:
    return DeclaredDomain(
        name=name,
        kind=kind,
        capacity_bytes=capacity,
        safety_margin_bytes=int(capacity * DEFAULT_MARGIN_PERCENT / 100),
        device=device,
    )


def machine_memory_bytes(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The memory this worker's processes may use: MemTotal, or the cgroup's limit when lower.

    Model hosts are this process's children, in its cgroup: in a container whose limit is below
    the host's memory, MemTotal would let placement fill past the point the kernel OOM-kills.
    psutil reads MemTotal; it has no cgroup reader, so the limit is read here.
    """
    total = int(psutil.virtual_memory().total)
    limit = _cgroup_limit(cgroup_root)
    return min(total, limit) if limit is not None else total


def _cgroup_limit(cgroup_root: Path) -> int | None:
    for path in (cgroup_root / "memory.max", cgroup_root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        # cgroup v2 says "max" when unlimited; v1 a number near 2**63.
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
        return None
    return None

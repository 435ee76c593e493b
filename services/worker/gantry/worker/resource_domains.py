"""The node's resource domains, as its Hello declares them: parsed from `--resource-domain` flags
or measured, and validated as a whole.

A declaration that leaves this module is valid: names are unique, there is at most one RAM domain,
at most one VRAM domain per GPU (named `gpuN.vram` after its device), a unified pool stands alone,
and every margin is below its capacity. The worker refuses to start on anything else, so the
scheduler's ledger never has to guess which domain a claim charges.

Parsing and validation are pure. Measuring the defaults reads the machine (its memory, and the
GPUs through the NVML seam): those readings come in as arguments, never as stand-in numbers.
"""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

from gantry.v1 import common_pb2
from gantry.worker.nvml_readings import Nvml, visible_devices

log = logging.getLogger(__name__)

FLAG = "--resource-domain"
FLAG_FORMAT = "NAME=KIND:CAPACITY[:MARGIN]"
DEFAULT_MARGIN_PERCENT = Decimal(10)
HOST_RAM = "host.ram"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_VRAM_NAME = re.compile(r"gpu(0|[1-9][0-9]{0,3})\.vram")
_SIZE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z]*)")
# Decimal units are powers of 1000, binary ones of 1024: "1.5GB" is 1_500_000_000 bytes.
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


class DomainKind(enum.Enum):
    RAM = "ram"
    VRAM = "vram"
    UNIFIED = "unified"

    @property
    def wire(self) -> common_pb2.ResourceKind:
        return _WIRE_KINDS[self]


_WIRE_KINDS = {
    DomainKind.RAM: common_pb2.RESOURCE_KIND_RAM,
    DomainKind.VRAM: common_pb2.RESOURCE_KIND_VRAM,
    DomainKind.UNIFIED: common_pb2.RESOURCE_KIND_UNIFIED,
}


class ResourceDomainError(ValueError):
    """An invalid declaration; `flags` are the `--resource-domain` values it is about."""

    def __init__(self, message: str, *, flags: Sequence[str] = ()) -> None:
        named = ", ".join(f"{FLAG} {flag}" for flag in flags)
        super().__init__(f"{named}: {message}" if named else message)
        self.flags = tuple(flags)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeclaredDomain:
    """One domain: placement may fill `capacity_bytes - safety_margin_bytes` of it at most."""

    name: str
    kind: DomainKind
    capacity_bytes: int
    safety_margin_bytes: int
    device: int = 0  # the GPU index of a VRAM domain
    flag: str = ""  # the flag that declared it; "" for a measured default

    def to_proto(self) -> common_pb2.ResourceDomain:
        return common_pb2.ResourceDomain(
            name=self.name,
            kind=self.kind.wire,
            capacity_bytes=self.capacity_bytes,
            safety_margin_bytes=self.safety_margin_bytes,
            device=self.device,
        )

    def describe(self) -> str:
        return (
            f"{self.name} ({self.kind.value}, {human_bytes(self.capacity_bytes)}, "
            f"margin {human_bytes(self.safety_margin_bytes)})"
        )


# ---- parsing --------------------------------------------------------------------------------


def parse_size(text: str) -> int:
    """Bytes from "512MiB", "16GiB", "1.5GB" or plain "1073741824"; fractions of a byte drop."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a size (e.g. 512MiB, 16GiB, 1.5GB or plain bytes)")
    unit = match["unit"].lower()
    if unit not in _UNITS:
        raise ValueError(
            f"{text!r} has an unknown unit {match['unit']!r}; use B, KB, MB, GB, TB, "
            "KiB, MiB, GiB or TiB"
        )
    return int(Decimal(match["number"]) * _UNITS[unit])


def parse_margin(text: str, capacity_bytes: int) -> int:
    """Bytes from a size, or from a percentage of the capacity ("10%")."""
    text = text.strip()
    if not text.endswith("%"):
        return parse_size(text)
    try:
        percent = Decimal(text[:-1].strip())
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a percentage") from None
    if not percent.is_finite() or not 0 <= percent < 100:
        raise ValueError(f"the margin {text!r} must be a percentage from 0 to below 100")
    return int(capacity_bytes * percent / 100)


def parse_domain(flag: str) -> DeclaredDomain:
    """One `--resource-domain NAME=KIND:CAPACITY[:MARGIN]` value (its own rules only)."""
    name, equals, spec = flag.partition("=")
    name = name.strip()
    if not equals:
        raise ResourceDomainError(f"expected {FLAG_FORMAT}", flags=[flag])
    if not _NAME.fullmatch(name):
        raise ResourceDomainError(
            f"the name {name!r} must be letters, digits, '.', '_' or '-' (at most 63)",
            flags=[flag],
        )
    parts = [part.strip() for part in spec.split(":")]
    if len(parts) not in (2, 3):
        raise ResourceDomainError(f"expected {FLAG_FORMAT}", flags=[flag])
    kind_text = parts[0].lower()
    try:
        kind = DomainKind(kind_text)
    except ValueError:
        raise ResourceDomainError(
            f"unknown kind {parts[0]!r}; use ram, vram or unified", flags=[flag]
        ) from None
    try:
        capacity = parse_size(parts[1])
        margin = parse_margin(parts[2], capacity) if len(parts) == 3 else 0
    except ValueError as error:
        raise ResourceDomainError(str(error), flags=[flag]) from None
    if capacity <= 0:
        raise ResourceDomainError("the capacity must be more than 0 bytes", flags=[flag])
    if margin >= capacity:
        raise ResourceDomainError(
            f"the margin ({human_bytes(margin)}) must be below the capacity "
            f"({human_bytes(capacity)})",
            flags=[flag],
        )
    device = 0
    if kind is DomainKind.VRAM:
        vram_name = _VRAM_NAME.fullmatch(name)
        if vram_name is None:
            raise ResourceDomainError(
                f"a vram domain is named gpuN.vram after its device (gpu0.vram, gpu1.vram, ...), "
                f"not {name!r}",
                flags=[flag],
            )
        device = int(vram_name[1])
    return DeclaredDomain(
        name=name,
        kind=kind,
        capacity_bytes=capacity,
        safety_margin_bytes=margin,
        device=device,
        flag=flag,
    )


def parse_declaration(flags: Sequence[str]) -> tuple[DeclaredDomain, ...]:
    """Every flag parsed, then the declaration checked as a whole."""
    return validate_declaration([parse_domain(flag) for flag in flags])


def validate_declaration(domains: Sequence[DeclaredDomain]) -> tuple[DeclaredDomain, ...]:
    """The rules between domains: one name once, one RAM domain, one VRAM domain per device,
    and a unified pool alone (it already holds every RAM and VRAM claim of the node)."""
    by_name: dict[str, DeclaredDomain] = {}
    for domain in domains:
        if domain.name in by_name:
            raise ResourceDomainError(
                f"the name {domain.name!r} is declared twice",
                flags=[by_name[domain.name].flag, domain.flag],
            )
        by_name[domain.name] = domain
    unified = [d for d in domains if d.kind is DomainKind.UNIFIED]
    if unified and len(domains) > 1:
        other = next(d for d in domains if d is not unified[0])
        pair = sorted((unified[0], other), key=list(domains).index)
        raise ResourceDomainError(
            "a unified domain is the node's one pool: it cannot stand beside another domain "
            "(its RAM and VRAM claims all charge it)",
            flags=[d.flag for d in pair],
        )
    ram = [d for d in domains if d.kind is DomainKind.RAM]
    if len(ram) > 1:
        raise ResourceDomainError(
            "a node has one RAM domain at most", flags=[ram[0].flag, ram[1].flag]
        )
    by_device: dict[int, DeclaredDomain] = {}
    for domain in (d for d in domains if d.kind is DomainKind.VRAM):
        if domain.device in by_device:
            raise ResourceDomainError(
                f"GPU {domain.device} has two vram domains",
                flags=[by_device[domain.device].flag, domain.flag],
            )
        by_device[domain.device] = domain
    return tuple(domains)


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


def machine_memory_bytes(
    meminfo: Path = Path("/proc/meminfo"), cgroup_root: Path = Path("/sys/fs/cgroup")
) -> int:
    """The memory this worker's processes may use: MemTotal, or the cgroup's limit when lower.

    Model hosts are this process's children, in its cgroup: in a container whose limit is below
    the host's memory, MemTotal would let placement fill past the point the kernel OOM-kills.
    """
    total = _meminfo_total(meminfo)
    limit = _cgroup_limit(cgroup_root)
    return min(total, limit) if limit is not None else total


def _meminfo_total(meminfo: Path) -> int:
    for line in meminfo.read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "MemTotal":
            number, _, unit = value.strip().partition(" ")
            if unit.strip().lower() != "kb":
                break
            return int(number) * 1024
    raise OSError(f"{meminfo} holds no MemTotal in kB")


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


def human_bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"

"""A node's resource-domain declaration: the `--resource-domain NAME=KIND:CAPACITY[:MARGIN]` grammar
and the rules a declaration keeps as a whole.

A declaration that leaves this module is valid: names are unique, there is at most one RAM domain,
at most one VRAM domain per GPU (named `gpuN.vram` after its device), a unified pool stands alone,
and every margin is below its capacity. The worker refuses to start on anything else, so the
scheduler's ledger never has to guess which domain a claim charges.

Pure, and shared: the worker parses its flags here, and `gantry up` refuses a bad declaration
before it starts anything, with the worker's own words, without importing the worker.
Measuring the defaults reads the machine and stays in the worker (gantry.worker.resource_domains).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from gantry.v1 import common_pb2

FLAG = "--resource-domain"
FLAG_FORMAT = "NAME=KIND:CAPACITY[:MARGIN]"

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


def human_bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"

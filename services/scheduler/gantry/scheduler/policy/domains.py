"""Which of a node's resource domains each claim charges (the rule is in ledger.py's docstring):
one resolution per node shape and demand, cached, so the ledger's hot path is a dict lookup."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from gantry.scheduler.policy.types import Claim, Domain, ResourceKind

RAM = int(ResourceKind.RAM)
VRAM = int(ResourceKind.VRAM)
UNIFIED = int(ResourceKind.UNIFIED)
KNOWN_CLAIM_KINDS = frozenset({RAM, VRAM})
# Demands repeat (one per deployment envelope), so a small cache per node shape serves nearly
# every lookup; it is cleared whole when full rather than tracking recency.
_RESOLUTION_CACHE_LIMIT = 256
_MIB = 1 << 20
_GIB = 1 << 30

Parts = tuple[tuple[int, int, int], ...]
LayoutKey = tuple[str | None, str | None, tuple[tuple[int, str], ...]]


@dataclass(frozen=True, slots=True)
class Demand:
    """Claims normalised once per request: nonzero bytes summed per (kind, device), sorted.

    Build it with ``demand_of``; placement hands one Demand to the ledger for every node.
    """

    parts: Parts  # (kind, device, bytes); kind RAM or VRAM, bytes > 0
    unknown_kinds: tuple[int, ...] = ()  # kinds other than RAM/VRAM, whatever their bytes


def demand_of(claims: Iterable[Claim]) -> Demand:
    totals: dict[tuple[int, int], int] = {}
    unknown: set[int] = set()
    for claim in claims:
        kind = int(claim.kind)
        if kind not in KNOWN_CLAIM_KINDS:
            unknown.add(kind)
            continue
        if claim.bytes <= 0:
            continue
        # RAM has no device: any device number on a RAM claim names the same domain.
        key = (kind, claim.device if kind == VRAM else 0)
        totals[key] = totals.get(key, 0) + claim.bytes
    parts = tuple((kind, device, amount) for (kind, device), amount in sorted(totals.items()))
    return Demand(parts=parts, unknown_kinds=tuple(sorted(unknown)))


def unknown_claim_kinds(claims: Iterable[Claim]) -> tuple[int, ...]:
    return tuple(sorted({int(c.kind) for c in claims if int(c.kind) not in KNOWN_CLAIM_KINDS}))


def format_bytes(amount: int) -> str:
    if amount >= _GIB:
        return f"{amount / _GIB:.1f} GiB"
    if amount >= _MIB or amount == 0:
        return f"{amount / _MIB:.1f} MiB"
    return f"{amount} B"


@dataclass(frozen=True, slots=True)
class MissingDomain:
    kind: int
    device: int

    def message(self, node_id: str) -> str:
        if self.kind == RAM:
            return f"node {node_id} has no RAM domain"
        return f"node {node_id} has no VRAM domain for device {self.device}"


@dataclass(frozen=True, slots=True)
class Resolution:
    """A demand resolved against one node shape: bytes per domain name, or the missing domain.

    ``memo_key`` is unique for the ledger's lifetime, so a node may remember its answer for this
    resolution under it without ever confusing two.
    """

    needs: tuple[tuple[str, int], ...]  # (domain name, bytes), sorted by name
    missing: MissingDomain | None
    memo_key: int


@dataclass(slots=True)
class Layout:
    """Which domain each (kind, device) charges on nodes of one shape (they share one Layout)."""

    unified: str | None
    ram: str | None
    vram_by_device: dict[int, str]
    memo_keys: Iterator[int]
    resolutions: dict[Parts, Resolution] = field(default_factory=dict)

    @classmethod
    def of(cls, key: LayoutKey, memo_keys: Iterator[int]) -> Layout:
        return cls(unified=key[0], ram=key[1], vram_by_device=dict(key[2]), memo_keys=memo_keys)

    def domain_for(self, kind: int, device: int) -> str | None:
        if self.unified is not None:
            return self.unified
        if kind == RAM:
            return self.ram
        return self.vram_by_device.get(device)

    def resolve(self, parts: Parts) -> Resolution:
        resolution = self.resolutions.get(parts)
        if resolution is not None:
            return resolution
        per_domain: dict[str, int] = {}
        missing: MissingDomain | None = None
        for kind, device, amount in parts:
            name = self.domain_for(kind, device)
            if name is None:
                missing = MissingDomain(kind, device)
                break
            per_domain[name] = per_domain.get(name, 0) + amount
        needs = () if missing else tuple(sorted(per_domain.items()))
        resolution = Resolution(needs=needs, missing=missing, memo_key=next(self.memo_keys))
        if len(self.resolutions) >= _RESOLUTION_CACHE_LIMIT:
            self.resolutions.clear()
        self.resolutions[parts] = resolution
        return resolution

    def charges_of(self, claims: Iterable[Claim]) -> dict[str, int]:
        """What a holder's claims charge here; a claim without a domain charges nothing."""
        charges: dict[str, int] = {}
        for claim in claims:
            kind = int(claim.kind)
            if kind not in KNOWN_CLAIM_KINDS or claim.bytes <= 0:
                continue
            name = self.domain_for(kind, claim.device)
            if name is not None:
                charges[name] = charges.get(name, 0) + claim.bytes
        return charges


def layout_key(domains: Iterable[Domain]) -> LayoutKey:
    """A node's shape. Where a node declares several domains for one role, the first counts."""
    unified: str | None = None
    ram: str | None = None
    vram: dict[int, str] = {}
    for domain in domains:
        if domain.kind == UNIFIED and unified is None:
            unified = domain.name
        elif domain.kind == RAM and ram is None:
            ram = domain.name
        elif domain.kind == VRAM:
            vram.setdefault(domain.device, domain.name)
    return unified, ram, tuple(sorted(vram.items()))

"""The resource ledger: every node's domains and every holder's charge, reserved and released in
lockstep, so a domain's reserved total always equals what its holders hold.

Domain resolution (which domain of its node a claim charges):
- RAM charges the node's RAM domain (a node declares at most one; if several, the first);
- VRAM with device d charges the node's VRAM domain with ``device == d``;
- on a node that declares a UNIFIED domain, RAM and VRAM claims (any device) both charge it;
- a claim of 0 bytes charges nothing and needs no domain;
- a nonzero claim whose domain the node lacks makes the node ineligible for a new request
  (NO_ELIGIBLE_NODE); a holder's such claim charges nothing until the node declares the domain;
- a claim of any other kind (UNSPECIFIED, UNIFIED as a claim kind, an unknown int) is never read
  as zero, whatever its bytes: a holder with one blocks admission on its whole node until it is
  reconciled, and a new request with one is refused on every node.

Holders are residencies or provisional placements. Charging is a fact reported by the control
plane, so it is recorded even past capacity (the domain is then simply full). A node's external
usage (memory its worker's heartbeat saw held by processes Gantry did not start) is charged too,
resolved like a holder's claims but held by no holder: it lowers what the domain has available
(``available``, ``fits``) and is never part of ``reserved``, which stays the holders' total.
A replacement pair (B charged with ``replaces=A`` on A's node) holds the componentwise maximum of
both until one is released. Totals are kept incrementally; ``recomputed_reserved`` rebuilds
them from scratch so tests can hold the two against each other.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gantry.scheduler.policy.domains import (
    VRAM,
    Demand,
    Layout,
    LayoutKey,
    demand_of,
    format_bytes,
    layout_key,
    unknown_claim_kinds,
)
from gantry.scheduler.policy.types import Claim, Domain

__all__ = ["Demand", "DomainView", "Fit", "Ledger", "demand_of"]

# A node remembers at most this many placement answers between two changes to it.
_MEMO_LIMIT = 64
_DOES_NOT_FIT = -1.0


@dataclass(frozen=True, slots=True)
class DomainView:
    node_id: str
    domain: Domain
    requested: int  # the sum of every holder's claim in the domain
    reserved: int  # what is held: requested, less the overlap of replacement pairs
    available: int  # max(0, capacity - margin - reserved)
    blocked_reason: str  # empty when the domain admits new claims


@dataclass(frozen=True, slots=True)
class Fit:
    """The answer of ``Ledger.fits``: ok, or a NO_CAPACITY / NO_ELIGIBLE_NODE refusal."""

    ok: bool
    reason: str = ""
    message: str = ""


@dataclass(slots=True)
class _NodeBook:
    node_id: str
    domains: dict[str, Domain]  # sorted by name
    layout: Layout
    usable: dict[str, int]  # capacity - margin, never below 0
    external: dict[str, int]  # held by processes Gantry did not start; only domains with some
    # The most holders the node's worker takes (its model-host bound); 0: no bound. A holder
    # needs a host whatever its bytes, so a full node refuses even a claim of nothing.
    max_holders: int = 0
    holders: int = 0
    requested: dict[str, int] = field(default_factory=dict)
    reserved: dict[str, int] = field(default_factory=dict)
    # usable - external - reserved; may be < 0
    headroom: dict[str, int] = field(default_factory=dict)
    uncertain_holders: dict[str, set[str]] = field(default_factory=dict)  # domain -> holders
    unknown_kind_holders: dict[str, int] = field(default_factory=dict)  # holder -> a kind
    # Resolution.memo_key -> free fraction, or _DOES_NOT_FIT. Cleared on every change to the
    # book, so placement recomputes only the nodes that changed since it last looked.
    memo: dict[int, float] = field(default_factory=dict)

    def hold(self, name: str, amount: int) -> None:
        self.reserved[name] += amount
        self.headroom[name] -= amount
        self.memo.clear()


@dataclass(slots=True)
class _Holder:
    holder_id: str
    node_id: str
    claims: tuple[Claim, ...]
    replaces: str
    uncertain: bool
    unknown_kinds: tuple[int, ...]
    charges: dict[str, int] = field(default_factory=dict)  # resolved when added to its node


class Ledger:
    """Every node's domains and every holder's charge; reserve and release in lockstep."""

    def __init__(self) -> None:
        self._books: dict[str, _NodeBook] = {}
        self._layouts: dict[LayoutKey, Layout] = {}
        self._memo_keys = itertools.count()
        self._holders: dict[str, _Holder] = {}
        self._holders_by_node: dict[str, set[str]] = {}
        self._replacers: dict[str, set[str]] = {}  # replaced id -> holders naming it
        self._replaced_by: dict[str, str] = {}  # active pairs, A -> B
        self._replacing: dict[str, str] = {}  # active pairs, B -> A

    # -- nodes -------------------------------------------------------------------------------

    def set_node(
        self,
        node_id: str,
        domains: Sequence[Domain],
        *,
        max_holders: int = 0,
        external: Sequence[Claim] = (),
    ) -> None:
        """Declare or re-declare a node's domains, its bound on holders (0: none) and its external
        usage (replacing the last). Its holders' charges stay and are resolved again against the
        new domains; a domain declared twice keeps its last declaration."""
        by_name = {domain.name: domain for domain in domains}
        key = layout_key(by_name.values())
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = Layout.of(key, self._memo_keys)
        usable = {name: max(0, by_name[name].capacity - by_name[name].margin) for name in by_name}
        names = sorted(by_name)
        # Resolved as a holder's claims are; external usage of a device with no domain is moot.
        taken = layout.charges_of(external)
        self._books[node_id] = _NodeBook(
            node_id=node_id,
            domains={name: by_name[name] for name in names},
            layout=layout,
            usable={name: usable[name] for name in names},
            external=taken,
            requested=dict.fromkeys(names, 0),
            reserved=dict.fromkeys(names, 0),
            headroom={name: usable[name] - taken.get(name, 0) for name in names},
            max_holders=max(0, max_holders),
        )
        holder_ids = self._holders_by_node.get(node_id, set())
        for holder_id in holder_ids:
            self._add_own(self._holders[holder_id])
        # Pairs depend on ids and nodes, not on domains: the same pairs stand, at new amounts.
        for holder_id in holder_ids:
            if holder_id in self._replacing:
                self._apply_overlap(self._replacing[holder_id], holder_id, sign=-1)

    def remove_node(self, node_id: str) -> None:
        """Forget the node; its holders are released too."""
        for holder_id in sorted(self._holders_by_node.get(node_id, ())):
            self.release(holder_id)
        self._books.pop(node_id, None)
        self._holders_by_node.pop(node_id, None)

    # -- holders -----------------------------------------------------------------------------

    def charge(
        self,
        holder_id: str,
        node_id: str,
        claims: Sequence[Claim],
        *,
        replaces: str = "",
        uncertain: bool = False,
    ) -> None:
        """Record one holder's charge (an idempotent upsert). ``replaces`` names the holder it
        replaces; ``uncertain`` keeps the charge and blocks admission where it charges."""
        replaces = "" if replaces == holder_id else replaces
        previous = self._holders.get(holder_id)
        around = self._unpair_around(holder_id, previous.replaces if previous else "", replaces)
        if previous is not None:
            self._forget(previous)
        holder = _Holder(
            holder_id=holder_id,
            node_id=node_id,
            claims=tuple(claims),
            replaces=replaces,
            uncertain=uncertain,
            unknown_kinds=unknown_claim_kinds(claims),
        )
        self._holders[holder_id] = holder
        self._holders_by_node.setdefault(node_id, set()).add(holder_id)
        if replaces:
            self._replacers.setdefault(replaces, set()).add(holder_id)
        self._add_own(holder)
        self._pair_around(around)

    def release(self, holder_id: str) -> None:
        """Release one holder's charge; an unknown holder is a no-op. Releasing one side of a
        replacement pair leaves the other holding its own: a transfer or a rollback."""
        holder = self._holders.get(holder_id)
        if holder is None:
            return
        around = self._unpair_around(holder_id, holder.replaces, "")
        self._forget(holder)
        self._pair_around(around)

    def holds(self, holder_id: str) -> bool:
        return holder_id in self._holders

    # -- questions ---------------------------------------------------------------------------

    def fits(self, node_id: str, claims: Sequence[Claim]) -> Fit:
        outcome = self.measure(node_id, demand_of(claims))
        return outcome if isinstance(outcome, Fit) else Fit(True)

    def measure(self, node_id: str, demand: Demand) -> Fit | float:
        """``fits`` and ``free_fraction`` in one pass: a refusing Fit, or the node's free
        fraction after charging the demand. Eligibility is checked before capacity."""
        book = self._books.get(node_id)
        if book is None:
            return Fit(False, "NO_ELIGIBLE_NODE", f"node {node_id} is not known")
        if demand.unknown_kinds:
            return Fit(
                False, "NO_ELIGIBLE_NODE", f"claim kind {demand.unknown_kinds[0]} is unknown"
            )
        resolution = book.layout.resolve(demand.parts)
        if resolution.missing is not None:
            return Fit(False, "NO_ELIGIBLE_NODE", resolution.missing.message(node_id))
        if book.unknown_kind_holders:
            return Fit(False, "NO_CAPACITY", _unknown_kind_message(book))
        if book.max_holders and book.holders >= book.max_holders:
            return Fit(False, "NO_CAPACITY", _full_message(book))
        for name, need in resolution.needs:
            if book.uncertain_holders.get(name):
                return Fit(False, "NO_CAPACITY", _uncertain_message(name, book))
            if need > book.headroom[name]:
                return Fit(False, "NO_CAPACITY", _short_message(book, name, need))
        return _fraction_after(book, resolution.needs)

    def free_fractions(self, node_ids: Iterable[str], demand: Demand) -> dict[str, float]:
        """``measure`` over many nodes, for placement: the free fraction of each node that fits
        the demand; the nodes that do not fit are left out."""
        fitting: dict[str, float] = {}
        if demand.unknown_kinds:
            return fitting
        parts = demand.parts
        books = self._books
        last_layout: Layout | None = None
        memo_key = 0
        for node_id in node_ids:
            book = books.get(node_id)
            if book is None:
                continue
            if book.layout is not last_layout:
                last_layout = book.layout
                memo_key = last_layout.resolve(parts).memo_key
            known = book.memo.get(memo_key)
            if known is None:
                outcome = self.measure(node_id, demand)
                known = outcome if type(outcome) is float else _DOES_NOT_FIT
                if len(book.memo) >= _MEMO_LIMIT:
                    book.memo.clear()
                book.memo[memo_key] = known
            if known >= 0.0:
                fitting[node_id] = known
        return fitting

    def free_fraction(self, node_id: str, claims: Sequence[Claim]) -> float:
        """After charging ``claims``, the smallest available / (capacity - margin) over the
        domains the claims touch (over all the node's domains when they touch none): the scarcest
        dimension. Clamped at 0; an unknown node, or claims it cannot resolve, give 0.0."""
        book = self._books.get(node_id)
        if book is None:
            return 0.0
        resolution = book.layout.resolve(demand_of(claims).parts)
        if resolution.missing is not None:
            return 0.0
        return _fraction_after(book, resolution.needs)

    def views(self) -> list[DomainView]:
        """Every domain of every node, sorted by node id, then domain name."""
        result = []
        for node_id in sorted(self._books):
            book = self._books[node_id]
            node_block = _unknown_kind_message(book) if book.unknown_kind_holders else ""
            for name, domain in book.domains.items():
                blocked = node_block
                if not blocked and book.uncertain_holders.get(name):
                    blocked = _uncertain_message(name, book)
                result.append(
                    DomainView(
                        node_id=node_id,
                        domain=domain,
                        requested=book.requested[name],
                        reserved=book.reserved[name],
                        available=max(0, book.headroom[name]),
                        blocked_reason=blocked,
                    )
                )
        return result

    def gpu_headroom(self, node_id: str, device: int) -> int | None:
        """What a new claim could still take of the GPU memory domain of ``device`` (its VRAM
        domain, or the unified pool), never below 0; None when the node declares neither."""
        book = self._books.get(node_id)
        name = book.layout.domain_for(VRAM, device) if book is not None else None
        if book is None or name is None:
            return None
        return max(0, book.headroom[name])

    def reserved(self, node_id: str, domain_name: str) -> int:
        """What the domain holds now; 0 for a node or domain not declared."""
        book = self._books.get(node_id)
        return book.reserved.get(domain_name, 0) if book is not None else 0

    def recomputed_reserved(self) -> dict[tuple[str, str], int]:
        """Every declared domain's reserved total, rebuilt from the holders and the pairing rule
        alone, not from the incremental totals or the pairs on record."""
        totals = {
            (node_id, name): 0 for node_id, book in self._books.items() for name in book.domains
        }
        charges = {
            holder_id: self._charges_of(holder) for holder_id, holder in self._holders.items()
        }
        for holder_id, holder in self._holders.items():
            for name, amount in charges[holder_id].items():
                totals[(holder.node_id, name)] += amount
            replaced = self._pair_target(holder_id)
            if replaced is not None:
                theirs = charges[replaced]
                for name, amount in charges[holder_id].items():
                    if name in theirs:
                        totals[(holder.node_id, name)] -= min(amount, theirs[name])
        return totals

    # -- bookkeeping -------------------------------------------------------------------------

    def _charges_of(self, holder: _Holder) -> dict[str, int]:
        book = self._books.get(holder.node_id)
        return book.layout.charges_of(holder.claims) if book is not None else {}

    def _add_own(self, holder: _Holder) -> None:
        holder.charges = self._charges_of(holder)
        book = self._books.get(holder.node_id)
        if book is None:
            return
        for name, amount in holder.charges.items():
            book.requested[name] += amount
            book.hold(name, amount)
            if holder.uncertain:
                book.uncertain_holders.setdefault(name, set()).add(holder.holder_id)
        if holder.unknown_kinds:
            book.unknown_kind_holders[holder.holder_id] = holder.unknown_kinds[0]
        book.holders += 1
        book.memo.clear()

    def _forget(self, holder: _Holder) -> None:
        """Take the holder's own charge off its node and drop it from every index."""
        book = self._books.get(holder.node_id)
        if book is not None:
            for name, amount in holder.charges.items():
                book.requested[name] -= amount
                book.hold(name, -amount)
                blockers = book.uncertain_holders.get(name)
                if blockers is not None:
                    blockers.discard(holder.holder_id)
                    if not blockers:
                        del book.uncertain_holders[name]
            book.unknown_kind_holders.pop(holder.holder_id, None)
            book.holders -= 1
            book.memo.clear()
        del self._holders[holder.holder_id]
        self._holders_by_node.get(holder.node_id, set()).discard(holder.holder_id)
        if holder.replaces:
            naming = self._replacers[holder.replaces]
            naming.discard(holder.holder_id)
            if not naming:
                del self._replacers[holder.replaces]

    def _pair_target(self, holder_id: str) -> str | None:
        """The holder this one is paired with as its replacement, by the pairing rule: B pairs
        with A when A is held on B's node, B is the smallest id naming A there, A replaces
        nothing held on its node and nothing held there replaces B. Each holder is then in at
        most one pair, so a pair never hides a third holder's charge."""
        holder = self._holders.get(holder_id)
        if holder is None or not holder.replaces:
            return None
        replaced = self._holders.get(holder.replaces)
        if replaced is None or replaced.node_id != holder.node_id:
            return None
        if min(self._replacers_on_node(replaced)) != holder_id:
            return None
        target_of_replaced = self._holders.get(replaced.replaces)
        if target_of_replaced is not None and target_of_replaced.node_id == replaced.node_id:
            return None
        if self._replacers_on_node(holder):
            return None
        return replaced.holder_id

    def _replacers_on_node(self, holder: _Holder) -> list[str]:
        return [
            other
            for other in self._replacers.get(holder.holder_id, ())
            if self._holders[other].node_id == holder.node_id
        ]

    def _unpair_around(self, holder_id: str, old_target: str, new_target: str) -> set[str]:
        """Dissolve every active pair touching the holder, the holders it names and the holders
        naming it: the only pairs a change to it can make or break (see ``_pair_target``).
        Return those ids, to pair again once the change is made."""
        around = {name for name in (holder_id, old_target, new_target) if name}
        around.update(self._replacers.get(holder_id, ()))
        for name in around:
            if name in self._replaced_by:
                self._dissolve(name, self._replaced_by[name])
            if name in self._replacing:
                self._dissolve(self._replacing[name], name)
        return around

    def _pair_around(self, around: set[str]) -> None:
        for name in sorted(around):
            for candidate in (name, *sorted(self._replacers.get(name, ()))):
                if candidate in self._replacing:
                    continue
                replaced = self._pair_target(candidate)
                if replaced is not None and replaced not in self._replaced_by:
                    self._replaced_by[replaced] = candidate
                    self._replacing[candidate] = replaced
                    self._apply_overlap(replaced, candidate, sign=-1)

    def _dissolve(self, replaced: str, replacement: str) -> None:
        self._apply_overlap(replaced, replacement, sign=+1)
        del self._replaced_by[replaced]
        del self._replacing[replacement]

    def _apply_overlap(self, replaced: str, replacement: str, *, sign: int) -> None:
        """A pair holds max(a, b) = a + b - min(a, b) per domain: take (or give back) the min."""
        old, new = self._holders[replaced], self._holders[replacement]
        book = self._books.get(new.node_id)
        if book is None:
            return
        for name, amount in new.charges.items():
            if name in old.charges:
                book.hold(name, sign * min(amount, old.charges[name]))


def _fraction_after(book: _NodeBook, needs: tuple[tuple[str, int], ...]) -> float:
    """The smallest share of usable space left after the needs, over the domains they touch (all
    of the node's when they touch none). A domain with nothing usable counts as 0."""
    if not needs:
        needs = tuple((name, 0) for name in book.usable)
        if not needs:
            return 1.0
    return min(
        max(0, book.headroom[name] - need) / book.usable[name] if book.usable[name] > 0 else 0.0
        for name, need in needs
    )


def _short_message(book: _NodeBook, name: str, need: int) -> str:
    available = max(0, book.headroom[name])
    message = f"{name} needs {format_bytes(need)}, {format_bytes(available)} available"
    taken = book.external.get(name, 0)
    if taken:
        message += f" ({format_bytes(taken)} held by GPU processes Gantry did not start)"
    return message


def _unknown_kind_message(book: _NodeBook) -> str:
    holder_id = min(book.unknown_kind_holders)
    kind = book.unknown_kind_holders[holder_id]
    return (
        f"node {book.node_id} holds residency {holder_id} with an unknown claim kind {kind}: "
        "nothing more is admitted there until it is reconciled"
    )


def _full_message(book: _NodeBook) -> str:
    return (
        f"its worker holds at most {book.max_holders} model hosts and"
        f" {book.holders} are resident or placed"
    )


def _uncertain_message(domain_name: str, book: _NodeBook) -> str:
    holder_id = min(book.uncertain_holders[domain_name])
    return f"{domain_name} is blocked by uncertain residency {holder_id}"

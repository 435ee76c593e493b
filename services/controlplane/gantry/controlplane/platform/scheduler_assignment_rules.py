"""Which scheduler every control-plane replica talks to: pure rules over the ordered list of
scheduler addresses (`--scheduler a,b,...`) and the one `scheduler_assignment` row.

One scheduler at a time serves every replica, so a tenant's share holds across replicas (one
core decides for all of them). The leader moves the row to the next scheduler that answers when
the active one has been silent or unreachable for the silence timeout; every replica follows the
row (platform/scheduler_assignment.py applies these rules).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gantry.common.client_config import split_addresses
from gantry.common.errors import GantryError


@dataclass(frozen=True, slots=True)
class Assignment:
    """The row: the active scheduler's address ("" before the first assignment) and the epoch
    of the assignment (bumped by each move, so a move decided on a stale read does not land)."""

    address: str = ""
    epoch: int = 0


def parse_addresses(value: str) -> tuple[str, ...]:
    """The ordered scheduler addresses of a `--scheduler` value (`host:port`, or several
    separated by commas, as a client's list is split). ValueError names what is wrong: an empty
    entry or a repeated one."""
    try:
        addresses = split_addresses(value)
    except GantryError as error:
        raise ValueError(f"has {error.message}") from None
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        raise ValueError(f"names {', '.join(repeated)} more than once")
    return addresses


def active_failed(*, connected: bool, silent_for_s: float, silence_timeout_s: float) -> bool:
    """Whether the active scheduler has failed: this replica's link to it takes no request (its
    stream is down, or it answers no ping) and has heard nothing from it for the silence timeout.
    A scheduler that restarts within the timeout keeps its place."""
    return not connected and silent_for_s >= silence_timeout_s


def reassign_reason(
    addresses: Sequence[str], assigned: Assignment, *, failed: bool, silent_for_s: float
) -> str | None:
    """Why the leader must name another scheduler, or None when the named one stays: none is
    named yet, the one named is not in this replica's list (the operator took it out), or it
    has failed (`active_failed`)."""
    if not assigned.address:
        return "no scheduler is named yet"
    if assigned.address not in addresses:
        return f"the scheduler at {assigned.address} is not among --scheduler's addresses"
    if failed:
        return f"the scheduler at {assigned.address} has not answered for {silent_for_s:.1f}s"
    return None


def probe_order(addresses: Sequence[str], current: str) -> tuple[str, ...]:
    """The candidates, in the order they are preferred: the addresses after the current one
    (wrapping round), never the current one itself; all of them when it is not listed."""
    if current not in addresses:
        return tuple(addresses)
    at = list(addresses).index(current)
    return (*addresses[at + 1 :], *addresses[:at])


def choose(order: Sequence[str], answering: Mapping[str, bool]) -> str | None:
    """The first candidate in `order` that answered its health check; None when none did."""
    return next((address for address in order if answering.get(address, False)), None)


def moved(assigned: Assignment, address: str) -> Assignment:
    """The row after the leader names `address`: the next epoch."""
    return Assignment(address=address, epoch=assigned.epoch + 1)

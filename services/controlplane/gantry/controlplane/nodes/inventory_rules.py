"""What a worker's inventory means for each residency record on its node. Pure: no IO, no clock.

The worker is the witness of what runs; the database is the record of what was wanted and
committed. A record is only ever moved to what the witness reports, never to a guess:
- a resident the worker holds for this generation with exactly the recorded artifact, adapter
  settings and environment is adopted as is;
- one it holds with anything different is UNCERTAIN and is unloaded (then re-placed if wanted);
- one it restarts after a crash is LOADING (with the crash recorded), RESIDENT again once back;
- one it cannot confirm stopped is UNCERTAIN (its envelope stays charged);
- one it no longer holds is gone: COLD, and loaded again when still wanted;
- a record from an older generation is gone with that worker process (its children die with it);
- an adopted endpoint (an external server the worker only routes to) is compared by its URL, not
  by an artifact it does not have, and one whose pings fail is not routed to (LOADING, with why)
  until it answers again: the worker never restarts it, so only its health says it serves.

A witness can be late: a replica stopped (SIGSTOP) or slow reads what its stream queued long
after it was sent, while another replica applied newer messages of the same worker. Every
inventory and job result carries the worker process's sequence (a `Stamp`, with the generation
it was sent under), and each record the one that last changed it: an inventory `older` than that
says nothing about the record (KEEP), and one older than the inventory last applied to the node
is not applied at all (nodes/gateway.py). Stamps of different generations are not ordered (a new
process counts from 1 again); an unstamped message (sequence 0, an older worker) orders nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gantry.controlplane.platform.state_machines import ResidencyState

CRASH_LOOP = "RUNTIME_CRASH_LOOP"
# Why a record is kept whatever an inventory says: a newer message of its worker changed it.
STALE_INVENTORY = "the inventory is older than the worker's message that last changed the record"


class Action(enum.Enum):
    KEEP = "keep"  # nothing to change
    ADOPT = "adopt"  # RESIDENT, exactly what was committed
    RESIDENT = "resident"  # back after an in-place restart (or the load result is late)
    RESTARTING = "restarting"  # the host went away and the worker restarts it in place
    UNCERTAIN = "uncertain"  # not what was committed, or its stop could not be verified
    GONE = "gone"  # nothing runs: COLD, and a new load when the deployment is still wanted
    UNLOADED = "unloaded"  # an unload finished (the worker no longer holds it)
    UNRESPONSIVE = "unresponsive"  # an adopted server fails its pings: held, but not routed to


@dataclass(frozen=True, slots=True)
class Stamp:
    """Which worker message: the generation it was sent under and its process's sequence."""

    generation: int = 0
    sequence: int = 0  # 0: unstamped (an older worker; a record no stamped message changed)


def older(message: Stamp, than: Stamp) -> bool:
    """Whether `message` was sent before `than` by the same worker process: only stamps of one
    generation are ordered, and an unstamped one is ordered with nothing."""
    return bool(
        message.sequence
        and than.sequence
        and message.generation == than.generation
        and message.sequence < than.sequence
    )


def advanced(applied: Stamp, message: Stamp) -> Stamp:
    """What a record's stamp is once `message` was applied to it: never moved back."""
    if not message.sequence or older(message, applied):
        return applied
    return message


def shown_stamp(node_inventory: Mapping[str, Any] | None) -> Stamp:
    """The stamp of the inventory a node's row shows (the last applied), from its JSON as
    `json_format.MessageToDict` writes it: a uint64 as a string, a zero left out."""
    shown = (node_inventory or {}).get("inventory") or {}
    return Stamp(int(shown.get("generation", 0)), int(shown.get("sequence", 0)))


class Stamped(Protocol):
    """A record that keeps the stamp of the worker message that last changed it (a residency)."""

    applied_generation: int
    applied_sequence: int


def stamp_of(record: Stamped) -> Stamp:
    return Stamp(record.applied_generation, record.applied_sequence)


def mark_applied(record: Stamped, message: Stamp) -> None:
    """Record on `record` (in memory; its transaction writes it) that `message` changed it."""
    applied = advanced(stamp_of(record), message)
    record.applied_generation, record.applied_sequence = applied.generation, applied.sequence


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordFacts:
    residency_id: str
    deployment_id: str
    state: ResidencyState
    generation: int
    artifact_digest: str
    adapter_digest: str
    environment_fingerprint: str
    load_in_flight: bool  # a LOAD job for it is queued, leased or running
    unload_in_flight: bool = False  # an UNLOAD job for it is queued, leased or running
    endpoint_url: str = ""  # an adopted deployment's server; empty for a model host
    applied: Stamp = Stamp()  # the worker message (result or inventory) that last changed it


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportedFacts:
    deployment_id: str
    state: ResidencyState  # RESIDENT, LOADING (first load or restarting), UNLOADING, UNCERTAIN
    pid: int
    artifact_digest: str
    adapter_digest: str
    environment_fingerprint: str
    restart_count: int
    failure_reason: str
    failure_message: str
    crash_loop: bool
    adopted: bool = False  # an external server the worker holds without a process
    endpoint_url: str = ""
    # An adopted server's failed liveness reading (the worker's health detail); empty when its
    # last ping was answered or none was read yet.
    unresponsive: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    residency_id: str
    action: Action
    why: str = ""


def mismatch(record: RecordFacts, reported: ReportedFacts) -> str:
    """Which committed fact the worker's resident differs in; empty when it matches exactly."""
    differences = [
        name
        for name, recorded, held in (
            ("artifact digest", record.artifact_digest, reported.artifact_digest),
            ("adapter settings", record.adapter_digest, reported.adapter_digest),
            ("environment", record.environment_fingerprint, reported.environment_fingerprint),
        )
        # A record without the fact (committed before it was recorded) cannot be compared.
        if recorded and recorded != held
    ]
    # An adopted server has no artifact or environment of ours to compare: what was committed is
    # its URL. A model host held where an endpoint was recorded (or the reverse) is never it.
    if bool(record.endpoint_url) != reported.adopted:
        differences.append("kind (adopted endpoint or model host)")
    elif record.endpoint_url and record.endpoint_url != reported.endpoint_url:
        differences.append("endpoint url")
    return ", ".join(differences)


def decide(
    records: Sequence[RecordFacts],
    reported: Mapping[str, ReportedFacts],
    *,
    generation: int,
    stamp: Stamp = Stamp(),
) -> tuple[list[Decision], list[str]]:
    """One decision per record, and the deployment ids the worker holds that nobody wants.
    `stamp`: the inventory's (its sequence, under the stream's generation)."""
    decisions = [
        _decide_one(record, reported.get(record.deployment_id), generation=generation)
        if not older(stamp, record.applied)
        else Decision(record.residency_id, Action.KEEP, STALE_INVENTORY)
        for record in records
    ]
    # A held deployment is accounted for by a live record that keeps it; an UNCERTAIN one gets an
    # UNLOAD job of its own, so it is not listed here.
    accounted = {
        record.deployment_id
        for record, decision in zip(records, decisions, strict=True)
        if record.state != ResidencyState.COLD and decision.action is not Action.GONE
    }
    unwanted = sorted(deployment_id for deployment_id in reported if deployment_id not in accounted)
    return decisions, unwanted


def _decide_one(record: RecordFacts, held: ReportedFacts | None, *, generation: int) -> Decision:
    state = record.state
    if state == ResidencyState.COLD:
        return Decision(record.residency_id, Action.KEEP)
    if record.generation and record.generation != generation and not record.load_in_flight:
        # Another worker process held it; its children died with it (parent-death signal).
        if state == ResidencyState.UNLOADING:
            return Decision(record.residency_id, Action.UNLOADED, "the worker restarted")
        return Decision(
            record.residency_id,
            Action.GONE,
            f"worker generation {record.generation} ended (now {generation})",
        )
    if record.unload_in_flight:
        # Its UNLOAD job's result settles it; the inventory only runs ahead of that result.
        return Decision(record.residency_id, Action.KEEP)
    if held is None:
        if state == ResidencyState.UNLOADING or state == ResidencyState.UNCERTAIN:
            return Decision(record.residency_id, Action.UNLOADED, "no longer held by the worker")
        if state == ResidencyState.LOADING and record.load_in_flight:
            return Decision(record.residency_id, Action.KEEP)  # its load is still under way
        return Decision(record.residency_id, Action.GONE, "the worker no longer holds it")
    if state in (ResidencyState.UNLOADING, ResidencyState.DRAINING):
        return Decision(record.residency_id, Action.KEEP)  # the unload job settles it
    if held.state == ResidencyState.UNLOADING:
        return Decision(record.residency_id, Action.KEEP)  # on its way out; it will say when gone
    if held.state == ResidencyState.UNCERTAIN:
        return Decision(
            record.residency_id, Action.UNCERTAIN, held.failure_message or "stop unverified"
        )
    if state == ResidencyState.RESIDENT or (
        state == ResidencyState.LOADING and not record.load_in_flight
    ):
        if different := mismatch(record, held):
            return Decision(
                record.residency_id,
                Action.UNCERTAIN,
                f"the worker's resident differs from the committed load in: {different}",
            )
    if held.adopted and held.unresponsive and held.state == ResidencyState.RESIDENT:
        if state == ResidencyState.RESIDENT:
            return Decision(record.residency_id, Action.UNRESPONSIVE, held.unresponsive)
        return Decision(record.residency_id, Action.KEEP)  # already not routed, or loading
    if held.state == ResidencyState.LOADING:
        if state == ResidencyState.RESIDENT or (
            state == ResidencyState.LOADING and not record.load_in_flight
        ):
            return Decision(record.residency_id, Action.RESTARTING, held.failure_reason)
        return Decision(record.residency_id, Action.KEEP)
    # The worker holds it RESIDENT.
    if state == ResidencyState.RESIDENT:
        return Decision(record.residency_id, Action.ADOPT)
    if state == ResidencyState.UNCERTAIN:
        return Decision(record.residency_id, Action.KEEP)  # an unload is on its way
    if state == ResidencyState.LOADING and record.load_in_flight:
        return Decision(record.residency_id, Action.KEEP)  # the LOAD result commits it
    return Decision(record.residency_id, Action.RESIDENT)

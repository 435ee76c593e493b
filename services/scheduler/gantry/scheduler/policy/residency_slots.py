"""A residency's slots in the scheduler: what its calls in flight hold there, what each call in
flight holds and where, and which residency with room a waiting call fits. Pure.

Slots are counted in inputs, as a residency announces them (its model host's batch size): a call
takes as many slots as it has inputs (an Embed of 8 texts takes 8 of 32), at most all of its
residency's, so a call bigger than a residency runs there alone. Counted per call, 32 slots let
32 calls of 8 inputs out at once, 256 inputs for a host that works on 32: the rest waited in the
host, beyond a tenant's max_queue_depth, which counts only the calls waiting here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gantry.scheduler.policy.events import ResidencyInfo
from gantry.scheduler.policy.fair_queue import FairQueue, QueuedWork


@dataclass(slots=True)
class ResidencySlots:
    info: ResidencyInfo
    in_flight: int = 0  # slots held by its calls in flight: their inputs, not their count
    infra_failures: int = 0


@dataclass(frozen=True, slots=True)
class Assignment:
    residency_id: str
    node_id: str
    deployment_id: str
    tenant_id: str
    slots: int  # what it holds of its residency's slots: its inputs, at most all of them
    origin: str  # the control-plane stream that submitted it
    priority: int = 0  # the class it was served in (a Priority): only INTERACTIVE earns credits


def eligibility(
    share: Callable[[QueuedWork], bool] | None, open_: list[ResidencySlots], queue: FairQueue
) -> Callable[[QueuedWork], bool] | None:
    """Which of the tenants' next calls the queue may serve now, asked in fair order: one whose
    tenant is under its share (`share`; None: every tenant is) and that fits a residency with
    room. A call takes its inputs' slots, at most a residency's all, so it fits where that many
    are free or where nothing runs (a call bigger than a residency runs there alone).

    The first call under its share that fits nowhere stops the pop: the calls behind it in fair
    order wait too, so smaller calls never slip past a big one for ever; it goes once its room
    frees. While nothing runs somewhere, every call fits (and while every call waiting has one
    input, which the caller knows without asking).
    """
    if any(not r.in_flight for r in open_):
        return share
    room = max(r.info.slots - r.in_flight for r in open_)
    blocked = False

    def eligible(queued: QueuedWork) -> bool:
        nonlocal blocked
        if blocked or (share is not None and not share(queued)):
            return False
        if queued.inputs <= room:
            return True
        blocked = True
        return False

    return eligible


def fitting(open_: list[ResidencySlots], inputs: int) -> ResidencySlots:
    """The residency a call goes to: least slots held among those it fits, ties by node id, then
    residency id (the order of `open_`), so the same state gives the same answer. The caller
    allowed only a call that fits one."""
    best: ResidencySlots | None = None
    for residency in open_:
        held, slots = residency.in_flight, residency.info.slots
        if held + min(inputs, slots) > slots:
            continue
        if best is None or held < best.in_flight:
            best = residency
    assert best is not None, "a call was allowed that fits no residency"
    return best

"""One deployment's waiting work, served weighted-fair across tenants: a backlogged tenant gets its
weight's share of served cost, an idle tenant earns no credit, and INTERACTIVE goes before BATCH.

How it serves (start-time tags, finish-tag selection, one virtual time per priority class):
- Each tenant has a FIFO line per class. The item at the front of a line carries tags
  `start = max(V, last_finish[tenant])` and `finish = start + cost / weight`; pop serves the line
  front with the smallest finish tag, ties by enqueue order, and sets `V = max(V, served.start)`.
  A tenant that was idle comes back at V, so it cannot cash in the time it spent away.
- Tags are given when an item reaches the front of its line rather than at push. For a backlogged
  tenant that is the same number (its previous finish), and it lets `remove` forget an item
  entirely: a removed item never leaves a tag behind that would push its tenant's later work back.
- When a class runs empty its virtual time jumps to the largest finish tag it served, which ends
  the busy period: every tenant starts the next one level.
- A BATCH item waiting `aging_seconds` or longer is promoted at the next pop: it leaves the BATCH
  class and joins the back of its tenant's INTERACTIVE line, tagged as if it arrived there at that
  moment, so it competes fairly with interactive work instead of jumping it. Within a class a
  tenant's items are served in the order they entered that class.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gantry.common.errors import GantryError
from gantry.scheduler.policy.types import Priority


@dataclass(slots=True, eq=False)
class QueuedWork:
    work_id: str
    tenant_id: str
    deployment_id: str
    priority: Priority
    cost: int  # >= 1
    enqueued_at: float  # monotonic seconds
    deadline_at: float | None  # None = no deadline (the core expires work, not the queue)
    inputs: int = 1  # >= 1: the slots it asks of a residency (the core caps it at the residency's)
    origin: str = ""  # the control-plane stream that submitted it


@dataclass(slots=True, eq=False)
class _Entry:
    work: QueuedWork
    weight: int
    seq: int  # global enqueue order: the tie-break between equal finish tags
    holder: _Lane | None = None  # the class whose line it sits in; None once served or removed
    start: float = 0.0
    finish: float = 0.0


class _Lane:
    """One priority class: its virtual time, each tenant's line, and a heap of the lines' fronts.

    Invariant: every line's front is held by this lane, is tagged, and has exactly one valid heap
    entry. Entries further back that were removed or promoted stay in the deque as garbage and are
    skipped when they reach the front, which keeps removal O(1) (O(log tenants) at the front).
    """

    __slots__ = ("fronts", "held", "last_finish", "lines", "max_finish", "virtual_time")

    def __init__(self) -> None:
        self.virtual_time = 0.0
        self.max_finish = 0.0
        self.lines: dict[str, deque[_Entry]] = {}
        self.last_finish: dict[str, float] = {}
        # (finish, seq, tenant_id); valid while that tenant's line front still has this seq.
        self.fronts: list[tuple[float, int, str]] = []
        self.held = 0

    def push(self, entry: _Entry) -> None:
        entry.holder = self
        self.held += 1
        tenant_id = entry.work.tenant_id
        line = self.lines.get(tenant_id)
        if line is None:
            self.lines[tenant_id] = deque((entry,))
            start = self.last_finish.get(tenant_id, 0.0)
            self._tag_front(entry, max(self.virtual_time, start))
        else:
            line.append(entry)

    def pop(self, eligible: Callable[[QueuedWork], bool] | None = None) -> _Entry | None:
        """The line front with the smallest finish tag, among the fronts `eligible` allows."""
        fronts = self.fronts
        lines = self.lines
        passed: list[tuple[float, int, str]] = []
        try:
            while fronts:
                front = heapq.heappop(fronts)
                line = lines.get(front[2])
                if line is None or line[0].seq != front[1]:
                    continue  # a stale front: that item was removed or promoted
                if eligible is not None and not eligible(line[0].work):
                    passed.append(front)  # it keeps its tag and its place
                    continue
                return self._serve(front[2], line)
            return None
        finally:
            for front in passed:
                heapq.heappush(fronts, front)

    def _serve(self, tenant_id: str, line: deque[_Entry]) -> _Entry:
        entry = line.popleft()
        entry.holder = None
        self.held -= 1
        if entry.start > self.virtual_time:
            self.virtual_time = entry.start
        if entry.finish > self.max_finish:
            self.max_finish = entry.finish
        self.last_finish[tenant_id] = entry.finish
        self._settle_line(tenant_id, line, entry.finish)
        if self.held == 0:
            self._end_busy_period()
        return entry

    def remove(self, entry: _Entry) -> None:
        entry.holder = None
        self.held -= 1
        tenant_id = entry.work.tenant_id
        line = self.lines[tenant_id]
        if line[0] is entry:
            line.popleft()
            # The next item inherits the removed one's start: the tenant keeps its place, and
            # since nothing was served, it gains nothing either.
            self._settle_line(tenant_id, line, entry.start)
        if self.held == 0:
            self._end_busy_period()

    def drain(self) -> list[_Entry]:
        served: list[_Entry] = []
        while (entry := self.pop()) is not None:
            served.append(entry)
        return served

    def _settle_line(self, tenant_id: str, line: deque[_Entry], start_floor: float) -> None:
        while line and line[0].holder is not self:
            line.popleft()
        if not line:
            del self.lines[tenant_id]
            return
        self._tag_front(line[0], max(self.virtual_time, start_floor))

    def _tag_front(self, entry: _Entry, start: float) -> None:
        entry.start = start
        entry.finish = start + entry.work.cost / entry.weight
        heapq.heappush(self.fronts, (entry.finish, entry.seq, entry.work.tenant_id))
        if len(self.last_finish) > 4 * len(self.lines) + 64:
            self._forget_spent_finishes()

    def _forget_spent_finishes(self) -> None:
        # A finish tag at or below V changes nothing (start = max(V, it)), so dropping it keeps
        # memory bounded by busy tenants rather than by every tenant ever seen.
        floor = self.virtual_time
        self.last_finish = {t: f for t, f in self.last_finish.items() if f > floor}

    def _end_busy_period(self) -> None:
        self.virtual_time = max(self.virtual_time, self.max_finish)
        self.last_finish.clear()
        self.fronts.clear()


class FairQueue:
    """One deployment's waiting work."""

    def __init__(self, *, aging_seconds: float) -> None:
        if aging_seconds < 0:
            raise GantryError(
                "INVALID_ARGUMENT", f"aging_seconds must be >= 0, got {aging_seconds}"
            )
        self._aging_seconds = aging_seconds
        self._interactive = _Lane()
        self._batch = _Lane()
        self._entries: dict[str, _Entry] = {}
        self._depth_by_tenant: dict[str, int] = {}
        self._inputs_by_tenant: dict[str, int] = {}
        self._multi_input = 0  # entries of more than one input: while none, any free slot fits
        # BATCH entries in push order; enqueued_at comes from one monotonic clock, so the oldest
        # is at the front and aging only ever looks there.
        self._batch_arrivals: deque[_Entry] = deque()
        self._next_seq = 0

    def push(self, work: QueuedWork, *, weight: int) -> None:
        if work.work_id in self._entries:
            raise GantryError(
                "INVALID_ARGUMENT", f"work {work.work_id} is already queued", work_id=work.work_id
            )
        if work.cost < 1 or weight < 1 or work.inputs < 1:
            raise GantryError(
                "INVALID_ARGUMENT",
                f"work {work.work_id}: cost, weight and inputs must be >= 1 (cost {work.cost}, "
                f"weight {weight}, inputs {work.inputs})",
                work_id=work.work_id,
            )
        entry = _Entry(work=work, weight=weight, seq=self._next_seq)
        self._next_seq += 1
        self._entries[work.work_id] = entry
        tenant_id = work.tenant_id
        self._depth_by_tenant[tenant_id] = self._depth_by_tenant.get(tenant_id, 0) + 1
        inputs = work.inputs
        self._inputs_by_tenant[tenant_id] = self._inputs_by_tenant.get(tenant_id, 0) + inputs
        if inputs > 1:
            self._multi_input += 1
        if work.priority is Priority.BATCH:
            self._batch.push(entry)
            self._batch_arrivals.append(entry)
        else:
            self._interactive.push(entry)

    def pop(
        self, now: float, eligible: Callable[[QueuedWork], bool] | None = None
    ) -> QueuedWork | None:
        """The next work to serve among the tenants' next items that `eligible` allows (None:
        any), asked in fair order; a tenant passed over keeps its place and its tags."""
        if self._batch_arrivals:
            self._promote_aged(now)
        entry = self._interactive.pop(eligible)
        if entry is None:
            entry = self._batch.pop(eligible)
            if entry is None:
                return None
        self._forget(entry)
        return entry.work

    def remove(self, work_id: str) -> QueuedWork | None:
        entry = self._entries.get(work_id)
        if entry is None:
            return None
        assert entry.holder is not None  # every entry in _entries sits in a lane
        entry.holder.remove(entry)
        self._forget(entry)
        return entry.work

    def find(self, work_id: str) -> QueuedWork | None:
        entry = self._entries.get(work_id)
        return entry.work if entry is not None else None

    def drain(self) -> list[QueuedWork]:
        served = self._interactive.drain() + self._batch.drain()
        self._entries.clear()
        self._depth_by_tenant.clear()
        self._inputs_by_tenant.clear()
        self._multi_input = 0
        self._batch_arrivals.clear()
        return [entry.work for entry in served]

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, work_id: str) -> bool:
        return work_id in self._entries

    def depth_of(self, tenant_id: str) -> int:
        return self._depth_by_tenant.get(tenant_id, 0)

    def depths(self) -> dict[str, int]:
        """Each tenant with work waiting here, and how many of its calls wait."""
        return dict(self._depth_by_tenant)

    def waiting_inputs(self) -> dict[str, int]:
        """Each tenant with work waiting here, and the inputs of its calls waiting."""
        return dict(self._inputs_by_tenant)

    @property
    def all_single_input(self) -> bool:
        """Every call waiting has one input, so any free slot fits whichever comes next."""
        return not self._multi_input

    def _promote_aged(self, now: float) -> None:
        arrivals = self._batch_arrivals
        batch = self._batch
        oldest_allowed = now - self._aging_seconds
        while arrivals:
            entry = arrivals[0]
            if entry.holder is not batch:
                arrivals.popleft()  # served or removed since it arrived
                continue
            if entry.work.enqueued_at > oldest_allowed:
                return
            arrivals.popleft()
            batch.remove(entry)
            self._interactive.push(entry)

    def _forget(self, entry: _Entry) -> None:
        del self._entries[entry.work.work_id]
        tenant_id = entry.work.tenant_id
        depth = self._depth_by_tenant[tenant_id] - 1
        inputs = entry.work.inputs
        if inputs > 1:
            self._multi_input -= 1
        if depth:
            self._depth_by_tenant[tenant_id] = depth
            self._inputs_by_tenant[tenant_id] -= inputs
        else:
            del self._depth_by_tenant[tenant_id]
            del self._inputs_by_tenant[tenant_id]


def bench_fair_queue(tenants: int, operations: int) -> float:
    """Push+pop pairs per second with `tenants` tenants all backlogged; one pair is one operation.

    A measurement for `make bench`, not a test. It is the only place here that reads a clock.
    """
    import time  # imported here: the policy itself never reads a clock

    chooser = random.Random(8)
    queue = FairQueue(aging_seconds=30.0)
    weights = {f"tenant-{i}": chooser.randint(1, 8) for i in range(tenants)}
    tenant_ids = list(weights)
    for index, tenant_id in enumerate(tenant_ids * 4):
        queue.push(_bench_work(index, tenant_id, chooser), weight=weights[tenant_id])
    base = len(tenant_ids) * 4
    # Built before the clock starts, so the figure is the queue's cost alone.
    arrivals = [
        (_bench_work(base + offset, tenant_id, chooser), weights[tenant_id], (base + offset) * 1e-3)
        for offset, tenant_id in enumerate(chooser.choice(tenant_ids) for _ in range(operations))
    ]
    began = time.perf_counter()
    for work, weight, now in arrivals:
        queue.push(work, weight=weight)
        queue.pop(now)
    elapsed = time.perf_counter() - began
    return operations / elapsed if elapsed > 0 else float("inf")


def _bench_work(index: int, tenant_id: str, chooser: random.Random) -> QueuedWork:
    return QueuedWork(
        work_id=f"w{index}",
        tenant_id=tenant_id,
        deployment_id="bench",
        priority=Priority.BATCH if index % 5 == 0 else Priority.INTERACTIVE,
        cost=chooser.randint(1, 16),
        enqueued_at=index * 1e-3,
        deadline_at=None,
    )

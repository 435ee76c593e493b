"""Queued work's deadlines: a heap by when each is due, so the core's tick finds what expired
without looking at the rest. Pure: the core hands it the time.

An entry is never removed when its work is served or leaves early (that would cost a search);
the core skips such entries as they come due, and the heap is compacted whenever they outnumber
the work still queued by far, so it stays bounded by the queue.
"""

from __future__ import annotations

import heapq
from collections.abc import Container


class Deadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._sequence = 0  # the tie-break between equal deadlines: the order they were set

    def add(self, work_id: str, due_at: float) -> None:
        self._sequence += 1
        heapq.heappush(self._heap, (due_at, self._sequence, work_id))

    def due(self, now: float) -> list[str]:
        """The work whose deadline has come, earliest first (some may have left already)."""
        heap = self._heap
        expired = []
        while heap and heap[0][0] <= now:
            expired.append(heapq.heappop(heap)[2])
        return expired

    def compact(self, queued: Container[str], queued_count: int) -> None:
        if len(self._heap) > 4 * queued_count + 1024:
            self._heap = [entry for entry in self._heap if entry[2] in queued]
            heapq.heapify(self._heap)

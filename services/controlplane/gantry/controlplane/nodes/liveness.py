"""Worker liveness in memory: when each stream on this control plane (node + generation) was last
heard from. Other replicas hold streams of their own: what they heard reaches this one only
through the database (`last_seen_at`, and each replica's `node_streams` rows).

A heartbeat costs a dictionary write here, not a database transaction: with a thousand workers
that is the difference between most of a core and almost nothing. `last_seen_at` reaches the
database in batches (`take_flush`: one statement for every node heard since the last flush, all
written with the earliest of their last heartbeats, a lower bound for each). So for a node with
a live stream here the row may lag what was heard by up to two flush intervals, and never runs
ahead of it; staleness of such a node is therefore decided from what was heard (`stale`), never
from that row. Only the stream's own generation refreshes a record: an older generation's late
heartbeat is fenced. Any message of that generation counts as heard, not only a heartbeat.

A stream told to heartbeat every k base intervals (heartbeat_pacing.py: the interval grows with
the fleet) is stale after its grace for k (`StaleGrace`): its own interval and the base grace's
slack for a late heartbeat.

Pure: no IO and no clock of its own; the caller passes `now` from its injected clock.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gantry.controlplane.nodes.heartbeat_pacing import StaleGrace


@dataclass(frozen=True, slots=True)
class Heard:
    """A stream (node + generation) last heard from at `heard_at`."""

    node_id: str
    generation: int
    heard_at: dt.datetime


@dataclass(frozen=True, slots=True)
class SeenBatch:
    """Nodes heard since the last flush; every one of them was heard at or after `seen_at`, on
    the streams `replica_id` holds (its `node_streams` rows are refreshed with the same time)."""

    node_ids: tuple[str, ...]
    seen_at: dt.datetime
    replica_id: str = ""


@dataclass(slots=True)
class _Stream:
    generation: int
    heard_at: dt.datetime
    # How many base heartbeat intervals its worker was told to wait between beats: its
    # staleness grace follows it (`StaleGrace`; it only rises while the stream lasts).
    multiple: int
    # The stream object itself (opaque here): a worker that reconnects within its generation
    # opens a second stream, and the first one's end must not forget the second.
    holder: object


class Liveness:
    """node id -> the generation whose stream is open here and when it was last heard."""

    def __init__(self, *, flush_interval_s: float, replica_id: str = "") -> None:
        self.replica_id = replica_id  # whose streams these are (the flushes name it)
        self._streams: dict[str, _Stream] = {}
        # Heard since the last flush: only these rows are written, the others did not change.
        self._unflushed: set[str] = set()
        self._flush_interval = dt.timedelta(seconds=flush_interval_s)
        self._last_flush: dt.datetime | None = None

    def connected(
        self,
        node_id: str,
        generation: int,
        now: dt.datetime,
        *,
        holder: object,
        multiple: int = 1,
    ) -> None:
        """`holder`'s Hello was committed (with `last_seen_at = now`, so nothing to flush); its
        Welcome tells it to beat every `multiple` base intervals."""
        current = self._streams.get(node_id)
        if current is not None and current.generation > generation:
            return  # the database fenced this generation already; never let it displace a newer
        self._streams[node_id] = _Stream(
            generation=generation, heard_at=now, multiple=multiple, holder=holder
        )
        self._unflushed.discard(node_id)

    def paced(self, node_id: str, *, holder: object, multiple: int) -> bool:
        """Whether `holder`'s worker is to be told to beat every `multiple` base intervals from
        now on: True when that is longer than it was told (its grace widens at once: a worker
        still sleeping out the shorter interval only beats sooner). False (nothing changed) when
        it was told as long already, or `holder` is not the node's stream here."""
        stream = self._streams.get(node_id)
        if stream is None or stream.holder is not holder or stream.multiple >= multiple:
            return False
        stream.multiple = multiple
        return True

    def heard(self, node_id: str, generation: int, now: dt.datetime) -> bool:
        """A heartbeat; False (and nothing recorded) unless `generation` holds the node here."""
        stream = self._streams.get(node_id)
        if stream is None or stream.generation != generation:
            return False
        stream.heard_at = max(stream.heard_at, now)
        self._unflushed.add(node_id)
        return True

    def disconnected(self, node_id: str, *, holder: object) -> bool:
        """`holder`'s stream ended; the record of any stream that replaced it is kept."""
        stream = self._streams.get(node_id)
        if stream is None or stream.holder is not holder:
            return False
        self._drop(node_id)
        return True

    def declared_stale(self, heard: Heard) -> bool:
        """The node was disconnected for the silence `heard` describes; forgotten unless a
        heartbeat or another stream came in since."""
        if self.last_heard(heard.node_id) != heard:
            return False
        self._drop(heard.node_id)
        return True

    def _drop(self, node_id: str) -> None:
        del self._streams[node_id]
        self._unflushed.discard(node_id)

    def tracks(self, node_id: str) -> bool:
        """Whether this control plane holds the node's stream (and so decides its staleness)."""
        return node_id in self._streams

    def last_heard(self, node_id: str) -> Heard | None:
        stream = self._streams.get(node_id)
        if stream is None:
            return None
        return Heard(node_id=node_id, generation=stream.generation, heard_at=stream.heard_at)

    def stale(self, now: dt.datetime, *, grace: StaleGrace) -> list[Heard]:
        """Streams not heard from for longer than their grace, oldest first: `grace` for the
        multiple of the base interval their worker was told."""
        heard_before: dict[int, dt.datetime] = {}  # by multiple: a fleet holds one or two of them
        silent = []
        for node_id, stream in self._streams.items():
            multiple = stream.multiple
            if (cutoff := heard_before.get(multiple)) is None:
                cutoff = heard_before[multiple] = now - dt.timedelta(
                    seconds=grace.seconds(multiple)
                )
            if stream.heard_at < cutoff:
                silent.append(
                    Heard(node_id=node_id, generation=stream.generation, heard_at=stream.heard_at)
                )
        return sorted(silent, key=lambda heard: (heard.heard_at, heard.node_id))

    def flush_due(self, now: dt.datetime) -> bool:
        """Something was heard since the last flush, and the flush interval has passed."""
        if not self._unflushed:
            return False
        return self._last_flush is None or now - self._last_flush >= self._flush_interval

    def take_flush(self, now: dt.datetime) -> SeenBatch | None:
        """What to write as `last_seen_at`: every node heard since the last flush (None when
        there is none). From here on they count as flushed; hand the batch to `flush_failed` if
        the write does not commit."""
        heard = {
            node_id: stream.heard_at
            for node_id in self._unflushed
            if (stream := self._streams.get(node_id)) is not None
        }
        self._unflushed.clear()
        self._last_flush = now
        if not heard:
            return None
        return SeenBatch(
            node_ids=tuple(sorted(heard)), seen_at=min(heard.values()), replica_id=self.replica_id
        )

    def flush_failed(self, batch: SeenBatch) -> None:
        """A batch the database did not take: written again with the next flush."""
        self._unflushed.update(node_id for node_id in batch.node_ids if node_id in self._streams)

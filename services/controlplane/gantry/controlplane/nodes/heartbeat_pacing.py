"""How often a worker heartbeats on its stream to this replica: an interval that grows with the
number of streams the replica holds, so the heartbeats it receives stay under `max_per_s` however
large the fleet grows (as Nomad bounds its heartbeats per second).

    interval(n) = base * max(1, ceil(n / (max_per_s * base)))

the smallest whole multiple of the base interval at which n streams beat at most `max_per_s`
times a second. Whole multiples, so the interval changes only every `max_per_s * base` streams
(300 with the defaults: 3 s and 100/s), and each change is told to each stream once.

A Welcome names the interval for the replica's streams at that moment (the new one counted). When
the replica holds enough streams for the interval to rise, every stream told less is told the new
interval (a HeartbeatInterval message). A stream's interval never falls while it lasts: a worker
still sleeping out a longer interval would be judged by a shorter one. A stream dialled after the
fleet shrank is told the shorter interval in its Welcome.

The liveness timeout follows the interval (`StaleGrace`): a stream told k base intervals is stale
once it stayed silent for its interval and the slack the base grace leaves a late heartbeat,
(stale_after_heartbeats - 1) base intervals:

    grace(k) = (k + stale_after_heartbeats - 1) * base

At the base interval that is the base grace (3 missed heartbeats of 3 s: 9 s); a stream told 12 s
is stale after 18 s, not after 3 of its own intervals (36 s). The slack is what a heartbeat may be
late by, and a late heartbeat is as late at any interval (a worker's loop stalled, its NVML read
slow, the network): it does not grow with the interval. So a worker silent on its stream is found
within

    grace(k) + one reconcile pass

(10 s up to 300 streams, 13 s up to 600, 16 s up to 900, 19 s up to 1,200). One whose
process exited is found sooner: its connection closes, its stream ends, and the goodbye marks it
DISCONNECTED. So is one whose process is frozen or whose host is cut off: the server's keepalive
(gantry.common.grpc_server.SERVER_KEEPALIVE) pings a connection silent for 13 s and closes it when
the ping goes unanswered for 7 s more, whatever the interval: within 20 s. A stream that beats
more often than every 13 s (up to 1,200 streams at the default bound) is never pinged.

Pure: no IO, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Heartbeats one replica takes per second from its whole fleet before the interval grows: 1,000
# workers at the 3 s base send 333/s, which cost 7.7 % of a core (fleet bench, issue 29). At
# 200/s (6 s) they cost 5.6-6.4 % where a bare grpc.aio server took 4.3-5.1 % for the same
# beats: only fewer beats go under 5 %. At 150/s (9 s, 111/s) 4.7-7.2 %, the bare server 3.1-5.0
# %. At 100/s they beat every 12 s (83/s): 3.0 % (the bare server 2.5 %) once the keepalive no
# longer pinged between beats (grpc_server.SERVER_KEEPALIVE). A frozen or cut-off worker is still
# found within 20 s by that keepalive, a hung one within 19 s (`StaleGrace`, 28 s before it).
# Nomad's default is 50/s.
DEFAULT_MAX_HEARTBEATS_PER_S = 100.0


@dataclass(frozen=True, kw_only=True)
class HeartbeatPacing:
    """The rule above: `base_interval_s` for a small fleet, grown to keep under `max_per_s`."""

    base_interval_s: float
    max_per_s: float = DEFAULT_MAX_HEARTBEATS_PER_S

    def __post_init__(self) -> None:
        if self.base_interval_s <= 0 or self.max_per_s <= 0:
            raise ValueError("the base interval and the heartbeat rate bound must be positive")

    def multiple(self, streams: int) -> int:
        """How many base intervals a stream waits between heartbeats when `streams` are held."""
        per_base_interval = self.max_per_s * self.base_interval_s
        return max(1, math.ceil(streams / per_base_interval))

    def interval_s(self, streams: int) -> float:
        """The interval to tell a stream when this replica holds `streams` (itself counted)."""
        return self.base_interval_s * self.multiple(streams)

    def grace(self, *, stale_after_heartbeats: float) -> StaleGrace:
        """The staleness grace of this pacing's streams."""
        return StaleGrace(
            base_interval_s=self.base_interval_s, stale_after_heartbeats=stale_after_heartbeats
        )

    def detection_bound_s(self, streams: int, *, stale_after_heartbeats: float) -> float:
        """How long a worker may stay silent on its stream before it is stale (the reconciler's
        next pass then disconnects it)."""
        grace = self.grace(stale_after_heartbeats=stale_after_heartbeats)
        return grace.seconds(self.multiple(streams))


@dataclass(frozen=True, kw_only=True)
class StaleGrace:
    """How long a stream told `multiple` base intervals may stay silent before it is stale: its
    own interval, and the slack the base grace leaves a late heartbeat (the module's rule)."""

    base_interval_s: float
    stale_after_heartbeats: float = 3.0

    def seconds(self, multiple: int = 1) -> float:
        return (multiple + self.stale_after_heartbeats - 1) * self.base_interval_s

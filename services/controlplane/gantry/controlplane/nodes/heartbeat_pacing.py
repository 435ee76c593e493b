"""How often a worker heartbeats on its stream to this replica: an interval that grows with the
number of streams the replica holds, so the heartbeats it receives stay under `max_per_s` however
large the fleet grows (as Nomad bounds its heartbeats per second).

    interval(n) = base * max(1, ceil(n / (max_per_s * base)))

the smallest whole multiple of the base interval at which n streams beat at most `max_per_s`
times a second. Whole multiples, so the interval changes only every `max_per_s * base` streams
(450 with the defaults: 3 s and 150/s), and each change is told to each stream once.

A Welcome names the interval for the replica's streams at that moment (the new one counted). When
the replica holds enough streams for the interval to rise, every stream told less is told the new
interval (a HeartbeatInterval message). A stream's interval never falls while it lasts: a worker
still sleeping out a longer interval would be judged by a shorter one. A stream dialled after the
fleet shrank is told the shorter interval in its Welcome.

The liveness timeout follows the interval: a stream told k base intervals is stale after k times
the base staleness grace (`Liveness.stale`), i.e. after the same number of missed heartbeats. So
a worker silent on its stream is found within

    stale_after_heartbeats * interval(n) + one reconcile pass

(3 * 3 s + 1 s up to 450 streams; 3 * 6 s + 1 s up to 900; 3 * 9 s + 1 s up to 1,350). One whose
process exited is found sooner: its connection closes, its stream ends, and the goodbye marks it
DISCONNECTED. So is one whose process is frozen or whose host is cut off: the server's keepalive
(gantry.common.grpc_server.SERVER_KEEPALIVE) pings a connection silent for 10 s and closes it when
the ping goes unanswered for 10 s more, whatever the interval.

Pure: no IO, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Heartbeats one replica takes per second from its whole fleet before the interval grows: 1,000
# workers at the 3 s base send 333/s, which cost 7.7 % of a core (fleet bench, issue 29). At
# 200/s (6 s) they cost 5.6-6.4 % where a bare grpc.aio server took 4.3-5.1 % for the same
# beats: only fewer beats go under 5 %. At 150/s they beat every 9 s (111/s); a frozen or cut-off
# worker is still found within 20 s by the transport's keepalive, a hung one within 28 s.
DEFAULT_MAX_HEARTBEATS_PER_S = 150.0


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

    def detection_bound_s(self, streams: int, *, stale_after_heartbeats: float) -> float:
        """How long a worker may stay silent on its stream before it is stale (the reconciler's
        next pass then disconnects it)."""
        return stale_after_heartbeats * self.interval_s(streams)

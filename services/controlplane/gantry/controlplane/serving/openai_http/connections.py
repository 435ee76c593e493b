"""How many connections the HTTP door holds, and for how long one may take to send its headers.

Without these, idle or header-trickling connections were held for ever: ~20,000 of them took every
file descriptor the control plane had, and with them its gRPC door, its database file and its log.
Each connection costs one descriptor; the door therefore holds at most a set number (never more than
half of the process's descriptor limit, so gRPC, the database and the workers always have room).
At that cap a new connection takes the place of the one that has waited longest for a request's
headers; only when every held connection has a request under way is the new one shed (a reset:
the descriptor is freed before anything is read). A connection that has not completed a
request's headers within the header timeout, at its start or after a response on a kept-alive
connection, is closed. All three are counted and logged at most once per interval, as totals,
never a line per connection. A response sent before its request's body has all arrived (a refusal
by the headers alone) ends the connection: at once for a caller without a valid key, whose body
is never read; after at most the door's body bound more, read and dropped, for a refused
authenticated caller, so a client that writes its whole body before reading still gets its 413.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 16_384
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
# Descriptors the rest of the process keeps whatever the HTTP door holds: gRPC, the database,
# the workers' streams, logs.
_REST_OF_THE_PROCESS = 0.5
_LOG_INTERVAL_S = 10.0
# The ASGI scope key the routes set once a call's key is verified: only such a call's connection
# lingers for its unread body after a refusal; any other closes with its answer.
AUTHENTICATED = "gantry.authenticated"


@dataclass(frozen=True, kw_only=True)
class DoorBounds:
    """The HTTP door's connection bounds (flags --http-max-connections, --http-header-timeout-s,
    --http-body-timeout-s)."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS  # capped at half the descriptor limit
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S  # to send a request's headers
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S  # for its body, once the headers are in


def raise_descriptor_limit() -> int:
    """The soft limit on open descriptors raised to the hard one (a container's default soft limit
    is often 1,024 beneath a hard limit a thousand times larger); returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as error:
            log.warning("could not raise the open-descriptor limit from %d: %s", soft, error)
    return soft


def connection_cap(requested: int, descriptor_limit: int) -> int:
    """At most `requested`, and never more than the share of the descriptor limit the door may
    take (at least 1: a door that can hold nothing is not a door)."""
    return max(1, min(requested, int(descriptor_limit * _REST_OF_THE_PROCESS)))


@dataclass
class DoorCounters:
    """What the door shed and cut since it started, and a rate limit on saying so."""

    shed: int = 0
    evicted: int = 0
    header_timeouts: int = 0
    _logged_shed: int = 0
    _logged_evicted: int = 0
    _logged_timeouts: int = 0
    _last_log: float = field(default=-_LOG_INTERVAL_S)

    def report(self, cap: int, header_timeout_s: float) -> None:
        now = time.monotonic()
        if now - self._last_log < _LOG_INTERVAL_S:
            return
        shed, evicted = self.shed - self._logged_shed, self.evicted - self._logged_evicted
        cut = self.header_timeouts - self._logged_timeouts
        if not (shed or evicted or cut):
            return
        self._last_log = now
        self._logged_shed, self._logged_evicted = self.shed, self.evicted
        self._logged_timeouts = self.header_timeouts
        log.warning(
            "HTTP door (at most %d connections): %d closed at the cap to make room (the longest "
            "waiting for headers), %d new ones shed at the cap (none was waiting), %d closed for "
            "not sending headers within %gs (since the last report)",
            cap,
            evicted,
            shed,
            cut,
            header_timeout_s,
        )


def bounded_protocol(
    *,
    max_connections: int,
    header_timeout_s: float,
    counters: DoorCounters,
    linger_bytes: int,
    linger_s: float,
) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with the door's two bounds, for one listener; an answer given before
    its request's body was all read ends the connection after at most `linger_bytes` more of it
    (read and dropped, within `linger_s`): the door's body bound and body timeout."""

    class BoundedH11Protocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._shed = False
            self._header_timer: asyncio.TimerHandle | None = None
            self._lingering: int | None = None  # bytes a lingering close still drops
            self._linger_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= max_connections and not _evict_oldest_waiting():
                self._shed = True
                counters.shed += 1
                counters.report(max_connections, header_timeout_s)
                transport.abort()  # nothing read, nothing buffered: the descriptor goes now
                return
            super().connection_made(transport)
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._shed:
                return  # it was never taken in: nothing of it to release
            self._cancel_header_timer()
            if self._linger_timer is not None:
                self._linger_timer.cancel()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._lingering is not None:
                self._lingering -= len(data)  # dropped unparsed: the call was answered
                if self._lingering <= 0:
                    self.transport.close()
                return
            super().data_received(data)
            if self in waiting and not self.waiting_for_headers():
                del waiting[self]  # its request is in: no longer the one to make room

        def on_response_complete(self) -> None:
            if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                # Answered before its body was all read (refused by its headers: no key, too
                # large). uvicorn would read the rest to its end to keep the connection, 60 MB
                # for a 60 MB refusal; the door closes instead, a known caller's after a linger.
                self.server_state.total_requests += 1
                if self.cycle is not None and self.cycle.scope.get(AUTHENTICATED):
                    self._linger()
                else:
                    self.transport.close()  # a stranger's body: not a byte more is read
                return
            super().on_response_complete()
            # A kept-alive connection owes the next request's headers in the same time.
            self._arm_header_timer()

        def _linger(self) -> None:
            """A lingering close: the response is out, the connection takes no next request;
            what the client was already sending is read and dropped, up to the door's body
            bound and within its body timeout, so a client that sends its whole body before
            reading (most HTTP clients) gets the answer rather than a reset; then the connection
            is closed, the rest never read."""
            self._cancel_header_timer()
            self._lingering = linger_bytes
            if self.transport.can_write_eof():
                self.transport.write_eof()  # the client reads the answer, then the end
            self._linger_timer = self.loop.call_later(linger_s, self.transport.close)
            self.flow.resume_reading()

        def waiting_for_headers(self) -> bool:
            return self.conn.their_state is h11.IDLE and (
                self.cycle is None or self.cycle.response_complete
            )

        def close_for_room(self) -> None:
            self._cancel_header_timer()
            counters.evicted += 1
            self.transport.abort()

        def _arm_header_timer(self) -> None:
            self._cancel_header_timer()
            if not self.transport.is_closing():
                self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)
                waiting[self] = None  # the newest owing headers: the last to make room

        def _cancel_header_timer(self) -> None:
            waiting.pop(self, None)
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            waiting.pop(self, None)
            if not self.waiting_for_headers() or self.transport.is_closing():
                return  # a request is under way: its own deadlines bound it
            counters.header_timeouts += 1
            counters.report(max_connections, header_timeout_s)
            self.transport.close()

    # Connections owing a request's headers, oldest first. At the cap the oldest of them is
    # closed to make room, and only when none owes headers is the new connection shed: a door
    # full of idle or trickling connections still lets a client with a whole request in, and a
    # flood of new connections evicts the flood's own before it reaches anyone mid-request.
    waiting: dict[BoundedH11Protocol, None] = {}

    def _evict_oldest_waiting() -> bool:
        while waiting:
            oldest = next(iter(waiting))
            del waiting[oldest]
            if oldest.waiting_for_headers() and not oldest.transport.is_closing():
                oldest.close_for_room()
                counters.report(max_connections, header_timeout_s)
                return True
        return False

    return BoundedH11Protocol

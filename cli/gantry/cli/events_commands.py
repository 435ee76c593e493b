"""`gantry events`: the audit trail, one page of it or followed live (operator token).

Without --follow: the newest N events that match (ListAuditEvents), printed oldest first; with
--after, the N events after that cursor instead. With --follow: the newest N, then
WatchAuditEvents from the last event seen, one flushed line per event. A dropped stream (the
control plane restarting) is resumed from the last event id seen, so nothing is printed twice or
skipped; the outage is said once on stderr. Formatting is pure: an event in, a line out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import grpc
from google.protobuf import json_format

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import DEFAULT_TIMEOUT_S, CommandContext, Metadata, open_channel
from gantry.cli.errors import format_rpc_error
from gantry.cli.output import add_output_argument, wants_json
from gantry.common.arg_types import non_negative
from gantry.v1 import control_plane_pb2, control_plane_pb2_grpc

DEFAULT_LIMIT = 20
LIST_PAGE_SIZE = 1000  # the server's largest page
# Reconnect backoff after a dropped watch: doubling from the first delay up to the cap, each
# delay drawn at random below its bound (full jitter) so many followers do not reconnect at once.
FIRST_RETRY_S = 0.2
MAX_RETRY_S = 5.0
# The stream codes that mean "the control plane went away", not "you may not" or "no such thing":
# a server shutting down ends open streams with UNAVAILABLE (or CANCELLED, when it cancels them).
RECONNECT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
# A watch that stayed open this long before it failed was a connection, so its loss is news.
STABLE_STREAM_S = 2.0


def add_events_arguments(events: CommandSpec) -> None:
    events.set_defaults(handler=events_command)
    events.add_argument(
        "--follow", "-f", action="store_true", help="keep printing new events until Ctrl-C"
    )
    events.add_argument(
        "--after",
        type=non_negative,
        default=None,
        metavar="EVENT_ID",
        help="the events after this cursor (oldest first) instead of the newest",
    )
    events.add_argument("--action", default="", metavar="A", help="e.g. residency.reclaim")
    events.add_argument("--subject-kind", default="", metavar="K", help="e.g. deployment")
    events.add_argument("--subject-id", default="", metavar="S")
    events.add_argument(
        "--limit",
        type=non_negative,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"events listed (default {DEFAULT_LIMIT}); with --follow, 0 shows only new ones",
    )
    add_output_argument(events)


# ---- formatting (pure) --------------------------------------------------------------------------


def event_line(event: control_plane_pb2.AuditEvent) -> str:
    detail = " ".join(
        f"{key}={' '.join(value.split()) or '-'}" for key, value in sorted(event.detail.items())
    )
    at = event.at.ToDatetime(tzinfo=dt.UTC)
    parts = [
        f"#{event.event_id}",
        f"{at:%Y-%m-%d %H:%M:%S}Z",  # a log line: the time, not an age that goes stale
        event.action,
        f"{event.subject_kind} {event.subject_id}".strip() or "-",
        f"by {event.actor or '-'}",
    ]
    return "  ".join(parts + ([detail] if detail else []))


def event_json(event: control_plane_pb2.AuditEvent) -> str:
    # One line per event, the proto's own field names (as grpcurl and `gantry jobs --json`).
    return json_format.MessageToJson(event, indent=None, preserving_proto_field_name=True)


# ---- reading the trail --------------------------------------------------------------------------

ListPage = Callable[[int, str], control_plane_pb2.ListAuditEventsResponse]


def events_after(list_page: ListPage, after: int) -> Iterator[control_plane_pb2.AuditEvent]:
    """Every matching event after the cursor, oldest first, page by page."""
    token = ""
    while True:
        response = list_page(after, token)
        yield from response.events
        token = response.next_page_token
        if not token:
            return


def newest_events(
    list_page: ListPage, *, head: int, count: int
) -> list[control_plane_pb2.AuditEvent]:
    """The newest `count` matching events, oldest first.

    The trail is listed oldest first only, so this reads windows ending at the head cursor,
    widening each (x4) until it holds enough matches or reaches the first event: a few small
    reads for a busy trail, about one full read for a filter that matches rarely.
    """
    if count == 0:
        return []
    window = max(count, 1)
    while True:
        start = max(0, head - window)
        found = list(events_after(list_page, start))
        if len(found) >= count or start == 0:
            return found[-count:]
        window *= 4


@dataclass(frozen=True, slots=True)
class Backoff:
    """Full-jitter exponential delays: attempt 0 waits below `first_s`, each next one below
    twice the last bound, never above `max_s`."""

    first_s: float = FIRST_RETRY_S
    max_s: float = MAX_RETRY_S

    def delay(self, attempt: int, draw: Callable[[], float] = random.random) -> float:
        bound = min(self.max_s, self.first_s * (2 ** min(attempt, 30)))
        return bound * draw()


def follow(
    watch: Callable[[int], Iterable[control_plane_pb2.AuditEvent]],
    *,
    cursor: int,
    emit: Callable[[control_plane_pb2.AuditEvent], None],
    warn: Callable[[str], None],
    wait_ready: Callable[[float], bool],
    backoff: Backoff | None = None,
    describe: Callable[[grpc.RpcError], str] = str,
    monotonic: Callable[[], float] = time.monotonic,
) -> None:
    """Print each event of `watch(cursor)` as it comes; on a dropped stream, resume after the
    last event printed. Returns only by an exception (Ctrl-C, or an error that is no outage).

    One outage is said once: a retry that fails again before it delivered an event or stayed
    open STABLE_STREAM_S is the same outage, not a new one.
    """
    delays = backoff or Backoff()
    attempt = 0
    outage = False  # announced, and no stream has proved itself since
    said_reconnected = False
    while True:
        opened_at = monotonic()
        delivered = False
        ended = ""
        try:
            for event in watch(cursor):
                emit(event)
                cursor = event.event_id
                delivered = True
                attempt = 0
                outage = False
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else None
            if code not in RECONNECT_CODES:
                raise
            ended = f"lost the event stream ({describe(error)})"
        else:
            ended = "the event stream ended"  # the server never ends it on its own
        proved = delivered or monotonic() - opened_at >= STABLE_STREAM_S
        if not outage or proved:
            warn(f"{ended}; reconnecting after #{cursor}")
            outage, said_reconnected = True, False
        # Wait out the backoff on the channel becoming ready, so a control plane that is back
        # sooner is used sooner; then open the next watch.
        while not wait_ready(max(delays.delay(attempt), 0.05)):
            attempt += 1
        attempt += 1
        if not said_reconnected:
            warn(f"reconnected; resuming after #{cursor}")
            said_reconnected = True


# ---- the command --------------------------------------------------------------------------------


def _filter(args: argparse.Namespace) -> control_plane_pb2.AuditEventFilter:
    return control_plane_pb2.AuditEventFilter(
        action=args.action, subject_kind=args.subject_kind, subject_id=args.subject_id
    )


def _write_line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()  # a pipe reader (grep, a test) sees each event as it comes


def _warn(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def events_command(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    event_filter = _filter(args)
    with _channel(context) as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)

        def list_page(after: int, token: str) -> control_plane_pb2.ListAuditEventsResponse:
            return stub.ListAuditEvents(
                control_plane_pb2.ListAuditEventsRequest(
                    page_size=LIST_PAGE_SIZE,
                    page_token=token,
                    filter=event_filter,
                    after_event_id=after,
                ),
                metadata=metadata,
                timeout=DEFAULT_TIMEOUT_S,
            )

        if args.after is not None:
            shown, cursor = _after_cursor(list_page, args)
        else:
            head = _head_cursor(stub, metadata)
            shown = newest_events(list_page, head=head, count=args.limit)
            cursor = max([head, *(event.event_id for event in shown)])
        if not args.follow:
            _print_page(shown, as_json=wants_json(args))
            return 0
        emit = (lambda e: _write_line(event_json(e))) if wants_json(args) else _emit_line
        for event in shown:
            emit(event)

        def watch(after: int) -> Iterable[control_plane_pb2.AuditEvent]:
            return stub.WatchAuditEvents(  # type: ignore[no-any-return]
                control_plane_pb2.WatchAuditEventsRequest(
                    after_event_id=after, filter=event_filter
                ),
                metadata=metadata,
            )

        def wait_ready(timeout_s: float) -> bool:
            # A call that waits for the channel, not grpc.channel_ready_future: that one starts
            # gRPC's connectivity-polling thread, which prints a traceback when Ctrl-C closes
            # the channel under it (seen once in a full test run, a follower ended right after
            # a reconnect). Any answer, a refusal included, says the control plane is back; the
            # watch that follows surfaces a refusal.
            try:
                stub.ListAuditEvents(
                    control_plane_pb2.ListAuditEventsRequest(page_size=1, filter=event_filter),
                    metadata=metadata,
                    timeout=timeout_s,
                    wait_for_ready=True,
                )
            except grpc.RpcError as error:
                code = error.code() if isinstance(error, grpc.Call) else None
                return code not in RECONNECT_CODES and code is not grpc.StatusCode.DEADLINE_EXCEEDED
            return True

        try:
            follow(
                watch,
                cursor=cursor,
                emit=emit,
                warn=_warn,
                wait_ready=wait_ready,
                describe=lambda error: format_rpc_error(error).removeprefix("error: "),
            )
        except KeyboardInterrupt:
            return 0  # Ctrl-C is how a follow ends
    return 0


def _channel(context: CommandContext) -> grpc.Channel:
    """The command's channel, retrying its connection on our schedule: gRPC's own reconnect
    backoff grows to two minutes, which would leave a follower silent long after a restarted
    control plane is back."""
    options: tuple[tuple[str, int], ...] = (
        ("grpc.initial_reconnect_backoff_ms", int(FIRST_RETRY_S * 1000)),
        ("grpc.min_reconnect_backoff_ms", int(FIRST_RETRY_S * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(MAX_RETRY_S * 1000)),
    )
    return open_channel(context.address, context.tls, options)


def _emit_line(event: control_plane_pb2.AuditEvent) -> None:
    _write_line(event_line(event))


def _after_cursor(
    list_page: ListPage, args: argparse.Namespace
) -> tuple[list[control_plane_pb2.AuditEvent], int]:
    """--after: with --follow, no listing (the watch replays from the cursor); without, the
    first N events after it, and a hint on stderr when more follow."""
    if args.follow:
        return [], args.after
    events: list[control_plane_pb2.AuditEvent] = []
    more = False
    for event in events_after(list_page, args.after):
        if len(events) == args.limit:
            more = True
            break
        events.append(event)
    if more and events:
        print(
            f"(more after #{events[-1].event_id}: --after {events[-1].event_id})", file=sys.stderr
        )
    return events, args.after


def _head_cursor(stub: control_plane_pb2_grpc.ControlPlaneStub, metadata: Metadata) -> int:
    # The registry snapshot carries the audit cursor as of its read: the newest event's id.
    snapshot = stub.GetRegistrySnapshot(
        control_plane_pb2.GetRegistrySnapshotRequest(), metadata=metadata, timeout=DEFAULT_TIMEOUT_S
    )
    return int(snapshot.last_event_id)


def _print_page(events: Sequence[control_plane_pb2.AuditEvent], *, as_json: bool) -> None:
    if as_json:
        dicts = [json_format.MessageToDict(e, preserving_proto_field_name=True) for e in events]
        print(json.dumps(dicts, indent=2))
        return
    for event in events:
        print(event_line(event))
    if not events:
        print("no events", file=sys.stderr)

"""`gantry queue`: the scheduler's queue, ledger, breakers and autoscale advice (operator token).

`render_queue_snapshot` is pure (a snapshot in, text out); `--watch` redraws it until Ctrl-C and
keeps going through a failed fetch (a restarting scheduler is worth watching, not exiting on);
`--json` prints the snapshot as the control plane sent it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Callable, Sequence

import grpc
from google.protobuf import json_format

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import DEFAULT_TIMEOUT_S, CommandContext
from gantry.cli.errors import format_rpc_error
from gantry.cli.output import add_output_argument, wants_json
from gantry.cli.tables import enum_label, format_bytes, render_table
from gantry.common.arg_types import positive_seconds
from gantry.v1 import common_pb2, control_plane_pb2_grpc, scheduler_pb2

DEFAULT_WATCH_INTERVAL_S = 2.0
# Home the cursor and clear the screen: each frame replaces the last, like watch(1).
CLEAR_SCREEN = "\033[H\033[2J"


def add_queue_arguments(queue: CommandSpec) -> None:
    queue.set_defaults(handler=queue_command)
    queue.add_argument(
        "--watch",
        nargs="?",
        type=positive_seconds,
        const=DEFAULT_WATCH_INTERVAL_S,
        default=None,
        metavar="SECONDS",
        help=f"redraw every SECONDS (default {DEFAULT_WATCH_INTERVAL_S:g}) until Ctrl-C",
    )
    add_output_argument(queue)


# ---- rendering (pure) ---------------------------------------------------------------------------


def _percent(share: float) -> str:
    return f"{share * 100:.1f}%"


def _breaker_state(state: int) -> str:
    return enum_label(scheduler_pb2.BreakerState.Name(state), "BREAKER_STATE_")


def _resource_kind(kind: int) -> str:
    return enum_label(common_pb2.ResourceKind.Name(kind), "RESOURCE_KIND_")


def _section(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["", title, render_table(headers, rows) if rows else "none"]


def tenant_load_rows(tenants: Sequence[scheduler_pb2.TenantLoad]) -> list[list[str]]:
    return [
        [
            tenant.tenant_id,
            str(tenant.weight),
            str(tenant.queued),
            str(tenant.in_flight),
            str(tenant.served_total),
            # An idle tenant (nothing waiting or running) has no weight share: it claims nothing.
            f"{_percent(tenant.served_share)} / "
            f"{_percent(tenant.weight_share) if tenant.weight_share else 'idle'}",
            str(tenant.rejected_total),
            f"{tenant.budget_used}/{tenant.budget_units or 'unlimited'}",
        ]
        for tenant in tenants
    ]


def ledger_rows(ledger: Sequence[scheduler_pb2.DomainLedger]) -> list[list[str]]:
    return [
        [
            entry.node_id,
            entry.domain.name,
            _resource_kind(entry.domain.kind),
            format_bytes(entry.domain.capacity_bytes),
            format_bytes(entry.domain.safety_margin_bytes),
            format_bytes(entry.requested_bytes),
            format_bytes(entry.reserved_bytes),
            format_bytes(entry.available_bytes),
            entry.blocked_reason or "-",
        ]
        for entry in ledger
    ]


def breaker_rows(breakers: Sequence[scheduler_pb2.BreakerView]) -> list[list[str]]:
    return [
        [
            breaker.node_id,
            breaker.deployment_id or "(node)",
            _breaker_state(breaker.state),
            str(breaker.consecutive_failures),
            f"{breaker.cooldown_left_seconds:.1f}s" if breaker.cooldown_left_seconds > 0 else "-",
        ]
        for breaker in breakers
    ]


def residency_rows(residencies: Sequence[scheduler_pb2.ResidencyLoad]) -> list[list[str]]:
    """Every residency the scheduler routes to, with its slots in use and its breaker."""
    return [
        [
            residency.residency_id,
            residency.deployment_id,
            residency.node_id,
            enum_label(common_pb2.ResidencyState.Name(residency.state), "RESIDENCY_STATE_"),
            f"{residency.in_flight}/{residency.slots}",
            str(residency.infra_failures),
            _breaker_state(residency.breaker),
        ]
        for residency in residencies
    ]


def advice_rows(advice: Sequence[scheduler_pb2.ScaleAdvice]) -> list[list[str]]:
    return [
        [
            item.deployment_id,
            str(item.current_replicas),
            str(item.desired_replicas),
            item.reason or "-",
        ]
        for item in advice
    ]


# Each concern's table header, in the order render_queue_snapshot prints them.
TENANT_HEADERS = (
    "TENANT",
    "WEIGHT",
    "QUEUED",
    "IN-FLIGHT",
    "SERVED",
    "SHARE(SERVED/WEIGHT)",
    "REJECTED",
    "BUDGET(USED/LIMIT)",
)
LEDGER_HEADERS = (
    "NODE",
    "DOMAIN",
    "KIND",
    "CAPACITY",
    "MARGIN",
    "REQUESTED",
    "RESERVED",
    "AVAILABLE",
    "BLOCKED",
)
RESIDENCY_HEADERS = (
    "RESIDENCY",
    "DEPLOYMENT",
    "NODE",
    "STATE",
    "IN-FLIGHT/SLOTS",
    "INFRA-FAILURES",
    "BREAKER",
)
BREAKER_HEADERS = ("NODE", "DEPLOYMENT", "STATE", "FAILURES", "COOLDOWN")
ADVICE_HEADERS = ("DEPLOYMENT", "CURRENT", "DESIRED", "REASON")


def _totals_lines(snapshot: scheduler_pb2.QueueSnapshot) -> list[str]:
    connection = (
        "connected to the control plane"
        if snapshot.control_plane_connected
        else "NOT connected to the control plane"
    )
    return [
        f"scheduler  {connection}",
        f"work       {snapshot.queued} queued, {snapshot.in_flight} in flight;"
        f" {snapshot.dispatched_total} dispatched, {snapshot.rejected_total} rejected,"
        f" {snapshot.expired_total} expired, {snapshot.cancelled_total} cancelled,"
        f" {snapshot.infra_failures_total} infra failures",
    ]


def render_queue_snapshot(snapshot: scheduler_pb2.QueueSnapshot) -> str:
    """Totals, then one table per concern; an empty concern says `none`."""
    lines = _totals_lines(snapshot)
    lines += _section("TENANTS", TENANT_HEADERS, tenant_load_rows(snapshot.tenants))
    lines += _section("LEDGER", LEDGER_HEADERS, ledger_rows(snapshot.ledger))
    lines += _section("RESIDENCIES", RESIDENCY_HEADERS, residency_rows(snapshot.residencies))
    lines += _section("BREAKERS", BREAKER_HEADERS, breaker_rows(snapshot.breakers))
    lines += _section("AUTOSCALE ADVICE", ADVICE_HEADERS, advice_rows(snapshot.advice))
    return "\n".join(lines)


def snapshot_json(snapshot: scheduler_pb2.QueueSnapshot, *, one_line: bool = False) -> str:
    # The proto's own field names, as grpcurl prints them, so the two outputs read alike.
    return json_format.MessageToJson(
        snapshot, indent=None if one_line else 2, preserving_proto_field_name=True
    )


# ---- the command --------------------------------------------------------------------------------


def watch(
    frame: Callable[[], str],
    *,
    interval_s: float,
    write: Callable[[str], None],
    sleep: Callable[[float], None] | None = None,
    clear: bool = True,
) -> int:
    """Draw `frame()` every `interval_s` until Ctrl-C, which ends it with exit status 0."""
    pause = sleep or time.sleep
    try:
        while True:
            write((CLEAR_SCREEN if clear else "") + frame() + "\n")
            pause(interval_s)
    except KeyboardInterrupt:
        return 0


def queue_command(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)

        def fetch() -> scheduler_pb2.QueueSnapshot:
            return stub.GetQueueSnapshot(
                scheduler_pb2.GetQueueSnapshotRequest(),
                metadata=metadata,
                timeout=DEFAULT_TIMEOUT_S,
            )

        if args.watch is None:
            snapshot = fetch()
            print(snapshot_json(snapshot) if wants_json(args) else render_queue_snapshot(snapshot))
            return 0

        def frame() -> str:
            try:
                snapshot = fetch()
            except grpc.RpcError as error:
                return format_rpc_error(error, address=context.address)
            if wants_json(args):
                return snapshot_json(snapshot, one_line=True)  # one JSON document per line
            taken = dt.datetime.now(dt.UTC)
            return f"every {args.watch:g}s  {taken:%Y-%m-%d %H:%M:%S}Z\n\n" + render_queue_snapshot(
                snapshot
            )

        return watch(frame, interval_s=args.watch, write=_write_now, clear=not wants_json(args))


def _write_now(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()

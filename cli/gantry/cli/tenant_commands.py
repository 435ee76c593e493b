"""`gantry tenants`: list tenants and their scheduling policies, show one, set one (operator).

`set` sends the whole policy (SetTenantPolicy replaces it): it reads the current one and changes
only the fields whose flags were given, so an unnamed field keeps its value.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, fields

import grpc

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import DEFAULT_TIMEOUT_S, CommandContext, paged
from gantry.cli.errors import CliError
from gantry.cli.output import add_output_argument, print_json, wants_json
from gantry.cli.tables import render_table
from gantry.common.arg_types import non_negative
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc

PRIORITY_NAMES: dict[str, int] = {
    "interactive": common_pb2.PRIORITY_INTERACTIVE,
    "batch": common_pb2.PRIORITY_BATCH,
}
_NAME_OF_PRIORITY = {value: name for name, value in PRIORITY_NAMES.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyChanges:
    """The flags of `gantry tenants set`; None leaves the field as it is."""

    weight: int | None = None
    max_queue_depth: int | None = None
    max_concurrency: int | None = None
    budget_units: int | None = None
    budget_window_seconds: int | None = None
    allowed_priorities: tuple[int, ...] | None = None

    @property
    def empty(self) -> bool:
        return all(getattr(self, field.name) is None for field in fields(self))


def parse_priorities(text: str) -> tuple[int, ...]:
    """`interactive,batch` -> the Priority values, for argparse (`type=`)."""
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PRIORITY_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown priority {unknown[0]!r}; use interactive, batch or interactive,batch"
        )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a priority is named twice in {text!r}")
    return tuple(PRIORITY_NAMES[name] for name in names)


def add_tenant_arguments(tenants: CommandSpec, options: CommandSpec) -> None:
    """`gantry tenants [list]`, `gantry tenants show TENANT`, `gantry tenants set TENANT ...`."""
    tenants.set_defaults(handler=tenants_list)
    add_output_argument(tenants)
    actions = tenants.add_subparsers(title="commands", metavar="COMMAND")
    listing = actions.add_parser("list", parents=[options], help="every tenant and its policy")
    listing.set_defaults(handler=tenants_list)
    add_output_argument(listing)
    show = actions.add_parser("show", parents=[options], help="one tenant's policy")
    show.set_defaults(handler=tenants_show)
    add_output_argument(show)
    show.add_argument("tenant_id", metavar="TENANT")
    change = actions.add_parser(
        "set",
        parents=[options],
        help="change a tenant's policy (creates the tenant); unnamed fields keep their values",
    )
    change.set_defaults(handler=tenants_set)
    change.add_argument("tenant_id", metavar="TENANT")
    change.add_argument("--weight", type=non_negative, metavar="N", help="fair share; 0 = 1")
    change.add_argument(
        "--max-queue-depth", type=non_negative, metavar="N", help="calls waiting; 0 = default"
    )
    change.add_argument(
        "--max-concurrency",
        type=non_negative,
        metavar="N",
        help="calls waiting or running; 0 = default",
    )
    change.add_argument(
        "--budget", type=non_negative, metavar="N", help="cost units per window; 0 = unlimited"
    )
    change.add_argument("--budget-window", type=non_negative, metavar="SECONDS", help="0 = 60")
    change.add_argument(
        "--priorities",
        type=parse_priorities,
        metavar="LIST",
        help="interactive, batch or interactive,batch",
    )


def policy_changes(args: argparse.Namespace) -> PolicyChanges:
    return PolicyChanges(
        weight=args.weight,
        max_queue_depth=args.max_queue_depth,
        max_concurrency=args.max_concurrency,
        budget_units=args.budget,
        budget_window_seconds=args.budget_window,
        allowed_priorities=args.priorities,
    )


def merged_policy(
    current: common_pb2.TenantPolicy, changes: PolicyChanges
) -> common_pb2.TenantPolicy:
    """The current policy with the given fields replaced; `current` is left as it was."""
    merged = common_pb2.TenantPolicy()
    merged.CopyFrom(current)
    if changes.weight is not None:
        merged.weight = changes.weight
    if changes.max_queue_depth is not None:
        merged.max_queue_depth = changes.max_queue_depth
    if changes.max_concurrency is not None:
        merged.max_concurrency = changes.max_concurrency
    if changes.budget_units is not None:
        merged.budget_units = changes.budget_units
    if changes.budget_window_seconds is not None:
        merged.budget_window_seconds = changes.budget_window_seconds
    if changes.allowed_priorities is not None:
        del merged.allowed_priorities[:]
        merged.allowed_priorities.extend(
            common_pb2.Priority.ValueType(p) for p in changes.allowed_priorities
        )
    return merged


def format_priorities(priorities: Sequence[int]) -> str:
    if not priorities:
        return "interactive,batch"
    return ",".join(_NAME_OF_PRIORITY.get(p, str(p)) for p in priorities)


def format_budget(policy: common_pb2.TenantPolicy) -> str:
    if policy.budget_units == 0:
        return "unlimited"
    return f"{policy.budget_units}/{policy.budget_window_seconds or 60}s"


def _or_default(value: int) -> str:
    return str(value) if value else "default"


def tenant_rows(policies: Sequence[common_pb2.TenantPolicy]) -> list[list[str]]:
    return [
        [
            policy.tenant_id,
            str(policy.weight or 1),
            _or_default(policy.max_queue_depth),
            _or_default(policy.max_concurrency),
            format_budget(policy),
            format_priorities(policy.allowed_priorities),
        ]
        for policy in policies
    ]


TENANT_HEADERS = ("TENANT", "WEIGHT", "DEPTH", "QUOTA", "BUDGET/WINDOW", "PRIORITIES")


def describe_policy(policy: common_pb2.TenantPolicy) -> list[str]:
    window = policy.budget_window_seconds or 60
    budget = (
        "unlimited"
        if policy.budget_units == 0
        else f"{policy.budget_units} cost units per {window}s"
    )
    return [
        f"tenant           {policy.tenant_id}",
        f"weight           {policy.weight or 1}",
        f"max queue depth  {_or_default(policy.max_queue_depth)}",
        f"max concurrency  {_or_default(policy.max_concurrency)}",
        f"budget           {budget}",
        f"priorities       {format_priorities(policy.allowed_priorities)}",
    ]


def tenants_list(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        found = list(
            paged(
                stub.ListTenants,
                control_plane_pb2.ListTenantsRequest,
                lambda response: response.tenants,
                metadata=metadata,
            )
        )
    if wants_json(args):
        print_json(found)
    else:
        print(render_table(TENANT_HEADERS, tenant_rows(found)))
    return 0


def tenants_show(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        policy = control_plane_pb2_grpc.ControlPlaneStub(channel).GetTenantPolicy(
            control_plane_pb2.GetTenantPolicyRequest(tenant_id=args.tenant_id),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
    if wants_json(args):
        print_json(policy)
    else:
        print("\n".join(describe_policy(policy)))
    return 0


def tenants_set(context: CommandContext, args: argparse.Namespace) -> int:
    changes = policy_changes(args)
    if changes.empty:
        raise CliError(
            "nothing to set: give --weight, --max-queue-depth, --max-concurrency, --budget,"
            " --budget-window or --priorities"
        )
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        try:
            current = stub.GetTenantPolicy(
                control_plane_pb2.GetTenantPolicyRequest(tenant_id=args.tenant_id),
                metadata=metadata,
                timeout=DEFAULT_TIMEOUT_S,
            )
        except grpc.RpcError as error:
            if not isinstance(error, grpc.Call) or error.code() != grpc.StatusCode.NOT_FOUND:
                raise
            current = common_pb2.TenantPolicy(tenant_id=args.tenant_id)  # set creates it
        stored = stub.SetTenantPolicy(
            control_plane_pb2.SetTenantPolicyRequest(policy=merged_policy(current, changes)),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
    print("\n".join(describe_policy(stored)))
    return 0

"""`gantry inventory NODE`: what a node last reported it holds (GetInventory, operator token).

Model hosts managed for a residency recorded there, those no residency accounts for, its GPUs and
every process on them (managed: its worker started it; external: placement charges its memory on
its own), its runtime environments and resource domains. NODE is an id or a name (resolved as
`gantry jobs --node` does). Rendering is pure: an inventory in, text out.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc
from google.protobuf import json_format

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import DEFAULT_TIMEOUT_S, CommandContext
from gantry.cli.jobs_commands import (
    failure_text,
    resolve_node_id,  # one rule for NODE arguments
)
from gantry.cli.output import add_output_argument, wants_json
from gantry.cli.tables import enum_label, format_bytes, format_timestamp, render_table
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc, worker_gateway_pb2


def add_inventory_arguments(inventory: CommandSpec) -> None:
    inventory.set_defaults(handler=inventory_command)
    inventory.add_argument("node", metavar="NODE", help="a node id or name")
    add_output_argument(inventory)


# ---- rendering (pure) ---------------------------------------------------------------------------


def _residency_state(state: int) -> str:
    return enum_label(common_pb2.ResidencyState.Name(state), "RESIDENCY_STATE_")


def _resource_kind(kind: int) -> str:
    return enum_label(common_pb2.ResourceKind.Name(kind), "RESOURCE_KIND_")


def _host_rows(models: Sequence[worker_gateway_pb2.ResidentModel]) -> list[list[str]]:
    return [
        [
            model.deployment_id,
            _residency_state(model.state),
            str(model.pid) if model.pid else "-",
            format_bytes(model.rss_bytes) if model.rss_bytes else "-",
            str(model.restart_count) + (" (crash loop)" if model.crash_loop else ""),
            failure_text(model.last_failure) if model.last_failure.reason else "-",
        ]
        for model in models
    ]


def _section(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["", title, render_table(headers, rows) if rows else "none"]


def _measured(measurement: common_pb2.Measurement) -> str:
    if measurement.WhichOneof("value") == "bytes":
        return format_bytes(measurement.bytes)
    return f"unavailable ({measurement.unavailable})" if measurement.unavailable else "-"


def _gpu_lines(reading: control_plane_pb2.NodeGpus, unavailable: str) -> list[str]:
    """The node's GPUs and their processes, or why there is no reading (never an empty table
    standing for "no GPU processes"); `unavailable`: what an older control plane said instead."""
    if reading.unavailable or not reading.gpus:
        return ["", f"GPUS: {reading.unavailable or unavailable or 'none reported'}"]
    external = {claim.device: claim.bytes for claim in reading.external_usage}
    gpus = [
        [
            f"cuda:{gpu.device}",
            _measured(gpu.used),
            _measured(gpu.total),
            format_bytes(external.get(gpu.device, 0)),
            gpu.processes_unavailable or str(len(gpu.processes)),
        ]
        for gpu in reading.gpus
    ]
    processes = [
        [
            f"cuda:{gpu.device}",
            str(process.pid),
            _measured(process.used),
            "managed" if process.managed else "external",
        ]
        for gpu in reading.gpus
        for process in gpu.processes
    ]
    title = f"GPUS (as of {format_timestamp(reading.reported_at)})"
    headers = ("DEVICE", "USED", "TOTAL", "EXTERNAL", "PROCESSES")
    lines = _section(title, headers, gpus)
    return lines + _section("GPU PROCESSES", ("DEVICE", "PID", "USED", "OWNER"), processes)


def render_inventory(inventory: control_plane_pb2.NodeInventory, *, node_name: str = "") -> str:
    named = f" ({node_name})" if node_name and node_name != inventory.node_id else ""
    lines = [
        f"node        {inventory.node_id}{named}",
        f"generation  {inventory.generation}",
        f"last seen   {format_timestamp(inventory.last_seen_at)}",
        f"adapters    {', '.join(inventory.adapters) or 'none'}",
    ]
    host_headers = ("DEPLOYMENT", "STATE", "PID", "RSS", "RESTARTS", "LAST FAILURE")
    lines += _section("MANAGED MODEL HOSTS", host_headers, _host_rows(inventory.managed))
    lines += _section(
        "UNMANAGED MODEL HOSTS (no residency here; unloaded on the worker's next connect)",
        host_headers,
        _host_rows(inventory.unmanaged),
    )
    lines += _gpu_lines(inventory.gpus, inventory.unmanaged_gpu_processes_unavailable)
    lines += _section(
        "ENVIRONMENTS",
        ("ENVIRONMENT", "DEVICE", "ADAPTERS", "AVAILABLE"),
        [
            [
                environment.environment_id or "(default)",
                environment.device_name or environment.device or "-",
                ",".join(environment.adapters) or "-",
                "yes"
                if environment.available
                else " ".join(["no", environment.unavailable_reason]).rstrip(),
            ]
            for environment in inventory.environments
        ],
    )
    lines += _section(
        "RESOURCE DOMAINS",
        ("DOMAIN", "KIND", "CAPACITY", "MARGIN"),
        [
            [
                domain.name,
                _resource_kind(domain.kind),
                format_bytes(domain.capacity_bytes),
                format_bytes(domain.safety_margin_bytes),
            ]
            for domain in inventory.resource_domains
        ],
    )
    return "\n".join(lines)


# ---- the command --------------------------------------------------------------------------------


def inventory_command(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        node_id = resolve_node_id(stub, args.node, metadata)
        try:
            inventory = stub.GetInventory(
                control_plane_pb2.GetInventoryRequest(node_id=node_id),
                metadata=metadata,
                timeout=DEFAULT_TIMEOUT_S,
            )
        except grpc.RpcError as error:
            if isinstance(error, grpc.Call) and error.code() == grpc.StatusCode.NOT_FOUND:
                print(f"error: NOT_FOUND: no node {node_id} (see `gantry nodes`)", file=sys.stderr)
                return 1
            raise
    if wants_json(args):
        print(json_format.MessageToJson(inventory, indent=2, preserving_proto_field_name=True))
    else:
        print(render_inventory(inventory, node_name=args.node))
    return 0

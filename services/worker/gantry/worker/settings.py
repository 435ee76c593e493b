"""`gantry worker`'s flags and configuration variables (its TLS to the control plane, its
logging), read and checked in one place (`read_settings`, on `gantry.common.service_settings`),
and the `WorkerSettings` its agent runs with. Its declared resource domains are checked there too.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import create_model

from gantry.common.arg_types import positive, positive_seconds
from gantry.common.errors import GantryError
from gantry.common.metrics import add_metrics_argument
from gantry.common.process import add_log_format_argument
from gantry.common.service_settings import (
    ClientTlsSettings,
    ProcessSettings,
    parse_settings,
)
from gantry.common.tls import add_client_tls_arguments
from gantry.worker.agent import WorkerSettings
from gantry.worker.control_planes import parse_control_planes
from gantry.worker.heartbeat_file import default_heartbeat_file
from gantry.worker.model_host.cpu_calibration import default_cache_dir
from gantry.worker.model_host.sandbox import REQUIRE_CHOICES
from gantry.worker.residents import DEFAULT_MAX_RESIDENTS
from gantry.worker.resource_domains import (
    FLAG,
    FLAG_FORMAT,
    DeclaredDomain,
    ResourceDomainError,
    parse_declaration,
)

# WorkerSettings fields exposed as flags (--restart-initial-backoff-s, ...), defaults from there.
_SUPERVISION_ARGUMENTS = {
    "restart_initial_backoff_s": "first restart delay after a model host crash; doubles per crash",
    "restart_max_backoff_s": "cap of the doubling restart delay",
    "crash_loop_threshold": "crashes within the window that make a crash loop",
    "crash_loop_window_s": "sliding window for counting crashes",
    "crash_loop_backoff_s": "restart delay while crash-looping",
    "ping_interval_s": "seconds between liveness pings of each model host",
    "ping_timeout_s": "a host that does not answer a ping within this is killed as hung",
    "outbox_limit": "messages queued for the control plane before new ones are dropped",
    "max_in_flight_invokes": "invocations in flight on this worker before QUEUE_FULL",
    "host_max_pending": "requests awaiting one model host before QUEUE_FULL",
    "host_inbox_limit": "requests queued inside one model host before QUEUE_FULL",
}


def build_parser() -> argparse.ArgumentParser:
    """The worker's flags (their variables are read by `WorkerConfig`)."""
    parser = argparse.ArgumentParser(prog="gantry worker")
    parser.add_argument(
        "--control-plane",
        default="127.0.0.1:50051",
        metavar="ADDRESS",
        help="the control plane: HOST:PORT (one stream); HOST:PORT,HOST:PORT,... (a stream to "
        "each replica); or dns:///NAME:PORT (a stream to each address NAME resolves to, "
        "resolved again every --control-plane-resolve-s) (default: 127.0.0.1:50051)",
    )
    parser.add_argument(
        "--control-plane-resolve-s",
        dest="resolve_interval_s",
        type=positive_seconds,
        default=WorkerSettings.resolve_interval_s,
        metavar="SECONDS",
        help="how often a dns:/// control plane is resolved again, so a replica added or gone "
        f"is followed (default: {WorkerSettings.resolve_interval_s:g})",
    )
    parser.add_argument("--credential-file", type=Path, required=True)
    parser.add_argument("--artifact-root", type=Path, required=True)
    _add_hosting_arguments(parser)
    parser.add_argument(
        "--heartbeat-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="rewritten every heartbeat interval, connected to the control plane or not; "
        f"`gantry worker --check` reads it (default: {default_heartbeat_file()})",
    )
    add_log_format_argument(parser)
    add_client_tls_arguments(
        parser.add_argument_group("TLS to the control plane (plaintext unless one is given)"),
        peer="the control plane",
    )
    _add_supervision_arguments(parser.add_argument_group("model host supervision"))
    add_metrics_argument(parser)
    return parser


def _add_hosting_arguments(parser: argparse.ArgumentParser) -> None:
    """How many model hosts the worker holds, how isolated, in which resource domains, and
    how it starts them."""
    parser.add_argument(
        "--max-residents",
        type=positive,
        default=DEFAULT_MAX_RESIDENTS,
        metavar="N",
        help="the most model hosts (served and adopted models) this worker holds at once; it "
        "says so in its Hello and placement sends it no more: a deployment finding every worker "
        f"full stays PENDING until one has room (default: {DEFAULT_MAX_RESIDENTS})",
    )
    parser.add_argument(
        "--require-isolation",
        choices=sorted(REQUIRE_CHOICES),
        default="none",
        help="refuse to run a model host sandboxed less than this: fs = Landlock filesystem "
        "rules, fs-net = also no TCP, fs-net-seccomp = also no socket but AF_UNIX and AF_NETLINK "
        "(no UDP or DNS) by a seccomp filter (default: none)",
    )
    parser.add_argument(
        FLAG,
        dest="resource_domains",
        action="append",
        default=[],
        metavar=FLAG_FORMAT,
        help="a resource domain placement may fill, repeatable: KIND ram, vram (named gpuN.vram "
        "after its GPU) or unified (the node's one pool); CAPACITY and MARGIN as 512MiB, 16GiB, "
        "1.5GB or bytes, MARGIN also as a percentage of CAPACITY (default 0). Without any: "
        "host.ram = this machine's memory and gpuN.vram per GPU NVML reads, each less 10%%",
    )
    parser.add_argument(
        "--no-warm-pool",
        dest="warm_pool",
        action="store_false",
        help="spawn every model host as a fresh interpreter that imports torch itself, instead "
        "of forking it from a preloaded fork server (the default, ready in about a second)",
    )
    parser.add_argument(
        "--host-cpu-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the model hosts' measured CPU wait policy and threads are kept, one file per "
        "machine and runtime environment (default: $XDG_CACHE_HOME/gantry or ~/.cache/gantry); "
        "delete its host-cpu-*.json to measure again",
    )
    parser.add_argument(
        "--no-host-cpu-measure",
        dest="host_cpu_measure",
        action="store_false",
        help="do not measure the model hosts' CPU wait policy: their idle threads sleep "
        "(OMP_WAIT_POLICY=PASSIVE) unless the environment says otherwise",
    )


def _add_supervision_arguments(supervision: argparse._ArgumentGroup) -> None:
    defaults = WorkerSettings(control_plane="", credential="", artifact_root=Path())
    for name, help_text in _SUPERVISION_ARGUMENTS.items():
        default = getattr(defaults, name)
        supervision.add_argument(
            f"--{name.replace('_', '-')}",
            type=type(default),
            default=default,
            help=f"{help_text} (default: {default})",
        )


class _WorkerFlags(ProcessSettings, ClientTlsSettings):
    """Every flag of `gantry worker` and the variables that may stand in for one; the
    supervision flags are declared from `_SUPERVISION_ARGUMENTS` below."""

    control_plane: str
    resolve_interval_s: float
    credential_file: Path
    artifact_root: Path
    max_residents: int
    require_isolation: str
    resource_domains: tuple[str, ...] = ()
    warm_pool: bool
    heartbeat_file: Path | None = None
    host_cpu_cache: Path | None = None
    host_cpu_measure: bool = True

    def declared_domains(self) -> tuple[DeclaredDomain, ...] | None:
        """The resource domains the flags declare, validated whole; None: measured at start.
        Raises ResourceDomainError."""
        return parse_declaration(self.resource_domains) if self.resource_domains else None

    def worker_settings(self, declared: tuple[DeclaredDomain, ...] | None) -> WorkerSettings:
        """What the agent is given (reads the credential file)."""
        return WorkerSettings(
            control_plane=self.control_plane,
            resolve_interval_s=self.resolve_interval_s,
            credential=self.credential_file.read_text().strip(),
            artifact_root=self.artifact_root,
            max_residents=self.max_residents,
            require_isolation=REQUIRE_CHOICES[self.require_isolation],
            tls=self.client_tls(),
            resource_domains=declared,
            warm_pool=self.warm_pool,
            heartbeat_file=self.heartbeat_file or default_heartbeat_file(),
            host_cpu_cache=(self.host_cpu_cache or default_cache_dir())
            if self.host_cpu_measure
            else None,
            **self.supervision(),
        )

    def supervision(self) -> dict[str, Any]:
        """The supervision flags' values by WorkerSettings field (`_SUPERVISION_ARGUMENTS`)."""
        return {name: getattr(self, name) for name in _SUPERVISION_ARGUMENTS}


def _supervision_fields() -> dict[str, Any]:
    defaults = WorkerSettings(control_plane="", credential="", artifact_root=Path())
    return {name: (type(getattr(defaults, name)), ...) for name in _SUPERVISION_ARGUMENTS}


if TYPE_CHECKING:
    WorkerConfig = _WorkerFlags
else:
    WorkerConfig = create_model("WorkerConfig", __base__=_WorkerFlags, **_supervision_fields())


def read_settings(
    argv: list[str] | None,
) -> tuple[WorkerConfig, tuple[DeclaredDomain, ...] | None]:
    """The flags and variables, checked, and the resource domains they declare; a bad one
    exits with status 2 saying why."""
    parser = build_parser()
    config = parse_settings(parser, WorkerConfig, argv)
    try:
        # Refused here, before anything connects: a node must never offer what it cannot hold.
        declared = config.declared_domains()
    except ResourceDomainError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")  # one line: the usage says nothing here
    try:
        parse_control_planes(config.control_plane)
    except GantryError as exc:
        parser.exit(2, f"{parser.prog}: error: --control-plane: {exc.message}\n")
    return config, declared

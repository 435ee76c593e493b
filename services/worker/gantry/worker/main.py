"""`gantry worker`: connect out to the control plane and serve until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from pathlib import Path

from gantry.common.arg_types import positive
from gantry.common.errors import GantryError
from gantry.common.manifest import sweep_abandoned_verified_roots
from gantry.common.metrics import add_metrics_argument, start_metrics
from gantry.common.process import (
    WORKER_STOP_BOUND_S,
    add_log_format_argument,
    run_until_signalled,
    setup_logging,
)
from gantry.common.telemetry import setup_tracing
from gantry.common.tls import (
    ClientTls,
    TlsSettingsError,
    add_client_tls_arguments,
    client_tls_from,
)
from gantry.worker.agent import WorkerAgent, WorkerSettings
from gantry.worker.heartbeat_file import default_heartbeat_file
from gantry.worker.liveness_check import CHECK_FLAG, check
from gantry.worker.model_host.sandbox import REQUIRE_CHOICES
from gantry.worker.residents import DEFAULT_MAX_RESIDENTS
from gantry.worker.resource_domains import (
    FLAG,
    FLAG_FORMAT,
    DeclaredDomain,
    ResourceDomainError,
    parse_declaration,
)
from gantry.worker.stop_plan import StopPlan

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


log = logging.getLogger(__name__)


def reclaim_abandoned_verified_copies() -> None:
    """Delete the verified copies of workers that died without removing them (SIGKILL, OOM)."""
    try:
        sweep = sweep_abandoned_verified_roots()
    except (OSError, GantryError) as exc:
        log.warning("could not sweep abandoned verified artifact copies: %s", exc)
        return
    log.info(
        "reclaimed %d verified-copy directories (%d bytes) abandoned by dead workers; "
        "%d belong to live processes",
        sweep.directories_removed,
        sweep.bytes_removed,
        sweep.directories_kept,
    )
    for failure in sweep.failures:
        log.warning("could not reclaim an abandoned verified-copy directory: %s", failure)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if CHECK_FLAG in argv:
        # The liveness probe: reads the heartbeat file only (no credential, no connection).
        return check(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    tls, declared = _checked_flags(parser, args)
    setup_logging("worker", args.log_format)
    setup_tracing("gantry-worker")
    if not start_metrics("gantry-worker", args.metrics_address):
        return 2
    reclaim_abandoned_verified_copies()
    return asyncio.run(_serve(_settings(args, tls=tls, declared=declared)))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gantry worker")
    parser.add_argument("--control-plane", default="127.0.0.1:50051")
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


def _checked_flags(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[ClientTls | None, tuple[DeclaredDomain, ...] | None]:
    """The TLS settings and declared resource domains, or the parser's exit saying why not."""
    try:
        tls = client_tls_from(args)
        if tls is not None:
            tls.credentials()  # every file readable now, not at the first connection
    except TlsSettingsError as exc:
        parser.error(str(exc))
    try:
        # Refused here, before anything connects: a node must never offer what it cannot hold.
        declared = parse_declaration(args.resource_domains) if args.resource_domains else None
    except ResourceDomainError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")  # one line: the usage says nothing here
    return tls, declared


def _settings(
    args: argparse.Namespace,
    *,
    tls: ClientTls | None,
    declared: tuple[DeclaredDomain, ...] | None,
) -> WorkerSettings:
    return WorkerSettings(
        control_plane=args.control_plane,
        credential=args.credential_file.read_text().strip(),
        artifact_root=args.artifact_root,
        max_residents=args.max_residents,
        require_isolation=REQUIRE_CHOICES[args.require_isolation],
        tls=tls,
        resource_domains=declared,
        warm_pool=args.warm_pool,
        heartbeat_file=args.heartbeat_file or default_heartbeat_file(),
        **{name: getattr(args, name) for name in _SUPERVISION_ARGUMENTS},
    )


async def _serve(settings: WorkerSettings) -> int:
    agent = WorkerAgent(settings)
    log.info("worker generation %d", agent.generation)
    runner = asyncio.create_task(agent.run())
    stopper = asyncio.create_task(run_until_signalled())
    done, _ = await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
    # The bound starts now, at the signal: its supervisor's grace (`gantry up`) is derived
    # from it, so every step below shares these deadlines instead of taking its own.
    loop = asyncio.get_running_loop()
    plan = StopPlan.starting(loop.time())
    log.info(
        "stopping %d model hosts at once: SIGTERM now, SIGKILL to any left after %.1fs",
        len(agent.residents),
        plan.term_grace_s(loop.time()),
    )
    for task in (runner, stopper):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await agent.shutdown(plan)
    unconfirmed = sorted(r.deployment_id for r in agent.residents)
    log.log(
        logging.ERROR if unconfirmed else logging.INFO,
        "stopped in %.2fs (bound %gs)%s",
        plan.elapsed_s(loop.time()),
        WORKER_STOP_BOUND_S,
        f"; not confirmed gone: {', '.join(unconfirmed)}" if unconfirmed else "",
    )
    # Fenced by a newer generation: exit non-zero so a supervisor restarts a fresh process.
    return 1 if runner in done else 0


if __name__ == "__main__":
    raise SystemExit(main())

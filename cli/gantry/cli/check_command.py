"""`gantry check DEPLOYMENT_ID`: deep health on demand, from the CLI.

CheckDeploymentHealth starts one HEALTH job (a real forward pass) per resident replica whose
worker is connected; this waits for those jobs (polling GetServingJob: the CLI is a client), shows
each one's layered report, and exits 1 when any replica is not healthy, with why.
"""

from __future__ import annotations

import argparse
import sys
import time

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import DEFAULT_TIMEOUT_S, CommandContext, Metadata
from gantry.cli.deployment_commands import add_wait_arguments
from gantry.cli.errors import CliError
from gantry.cli.jobs_commands import job_state_label, outcome, render_jobs
from gantry.cli.output import add_output_argument, print_json, wants_json
from gantry.v1 import control_plane_pb2, control_plane_pb2_grpc, worker_gateway_pb2

POLL_INTERVAL_S = 0.5
_J = control_plane_pb2
_TERMINAL = frozenset(
    {_J.SERVING_JOB_STATE_SUCCEEDED, _J.SERVING_JOB_STATE_FAILED, _J.SERVING_JOB_STATE_CANCELLED}
)
_LAYERS = ("process", "runtime", "model", "capability")


def add_check_arguments(parser: CommandSpec) -> None:
    parser.add_argument("deployment_id", metavar="DEPLOYMENT_ID")
    add_wait_arguments(parser)
    add_output_argument(parser)


def unhealthy_because(job: control_plane_pb2.ServingJob) -> str:
    """Why this HEALTH job says its replica is not healthy; "" when it is (pure)."""
    if job.state != _J.SERVING_JOB_STATE_SUCCEEDED:
        return f"{job_state_label(job.state)}: {outcome(job)}"
    failed = [
        name
        for name in _LAYERS
        if job.health.HasField(name)
        and getattr(job.health, name).status == worker_gateway_pb2.HEALTH_STATUS_FAILED
    ]
    return f"{', '.join(failed)} FAILED: {outcome(job)}" if failed else ""


def check_command(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        started = stub.CheckDeploymentHealth(
            control_plane_pb2.CheckDeploymentHealthRequest(deployment_id=args.deployment_id),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
        jobs = list(started.jobs)
        if not jobs:
            raise CliError(
                f"deployment {args.deployment_id} has no resident replica on a connected worker:"
                " nothing to check (gantry describe deployment shows why)"
            )
        if not args.no_wait:
            jobs = _wait(stub, metadata, jobs, timeout_s=args.wait_timeout)
    if wants_json(args):
        print_json(jobs)
    else:
        print(render_jobs(jobs))
    if args.no_wait:
        return 0
    problems = [(job, why) for job in jobs if (why := unhealthy_because(job))]
    for job, why in problems:
        print(f"error: replica on node {job.node_id} is not healthy: {why}", file=sys.stderr)
    return 1 if problems else 0


def _wait(
    stub: control_plane_pb2_grpc.ControlPlaneStub,
    metadata: Metadata,
    jobs: list[control_plane_pb2.ServingJob],
    *,
    timeout_s: float,
) -> list[control_plane_pb2.ServingJob]:
    deadline = time.monotonic() + timeout_s
    said = -1
    while True:
        done = sum(job.state in _TERMINAL for job in jobs)
        if done != said:
            print(f"health check: {done}/{len(jobs)} replica(s) done", file=sys.stderr, flush=True)
            said = done
        if done == len(jobs):
            return jobs
        if time.monotonic() >= deadline:
            raise CliError(
                f"health check still running after {timeout_s:g}s:"
                f" {len(jobs) - done} of {len(jobs)} job(s) not done"
            )
        time.sleep(POLL_INTERVAL_S)
        jobs = [
            job
            if job.state in _TERMINAL
            else stub.GetServingJob(
                control_plane_pb2.GetServingJobRequest(job_id=job.job_id),
                metadata=metadata,
                timeout=DEFAULT_TIMEOUT_S,
            )
            for job in jobs
        ]

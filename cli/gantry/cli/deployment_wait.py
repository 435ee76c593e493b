"""Waiting for a deployment to settle (`--wait` on deploy, unload, restart, scale).

The control plane keeps the truth; the CLI polls GetDeployment (it is a client: polling there is
fine) and says each change on stderr, e.g. `deployment d-1 LOADING: 0/2 resident (n-a LOADING)`.
Whether it settled, failed or must keep waiting is decided by `observe`, a pure function of one
GetDeployment answer, so the rule is tested without a server.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

from gantry.cli.connection import Metadata
from gantry.cli.errors import CliError
from gantry.cli.tables import enum_label
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc

Say = Callable[[str], None]
POLL_INTERVAL_S = 0.5
REMIND_EVERY_S = 10.0
CALL_TIMEOUT_S = 30.0

_D = control_plane_pb2
_RESIDENT = common_pb2.RESIDENCY_STATE_RESIDENT
_COLD = common_pb2.RESIDENCY_STATE_COLD


class Goal(enum.Enum):
    READY = "READY"  # READY with the wanted replicas RESIDENT and nothing else still loaded
    UNLOADED = "UNLOADED"


@dataclass(frozen=True, slots=True)
class Observation:
    line: str  # the progress line for this answer
    settled: bool
    failure: str = ""  # set when it will not reach the goal: why (reason: message)
    waiting_for: str = ""  # what is still missing, for a timeout's message


def deployment_state(deployment: control_plane_pb2.Deployment) -> str:
    return enum_label(_D.DeploymentState.Name(deployment.state), "DEPLOYMENT_STATE_")


def residency_state(residency: common_pb2.Residency) -> str:
    return enum_label(common_pb2.ResidencyState.Name(residency.state), "RESIDENCY_STATE_")


def _failure_text(failure: common_pb2.Failure) -> str:
    return f"{failure.reason}: {failure.message}" if failure.message else failure.reason


def last_failure(deployment: control_plane_pb2.Deployment) -> str:
    """The deployment's last failure, else the newest a loaded residency recorded (a COLD one's
    is history: a restart leaves them behind); "" when none."""
    if deployment.last_failure.reason:
        return _failure_text(deployment.last_failure)
    failed = [r for r in deployment.residencies if r.last_failure.reason and r.state != _COLD]
    if failed:
        newest = max(failed, key=lambda r: (r.updated_at.seconds, r.updated_at.nanos))
        return f"{_failure_text(newest.last_failure)} (node {newest.node_id})"
    return ""


def observe(deployment: control_plane_pb2.Deployment, goal: Goal) -> Observation:
    state = deployment_state(deployment)
    loaded = [r for r in deployment.residencies if r.state != _COLD]
    resident = sum(r.state == _RESIDENT for r in loaded)
    where = ", ".join(f"{r.node_id} {residency_state(r)}" for r in loaded)
    detail = f" ({where})" if where else ""
    head = f"deployment {deployment.deployment_id} {state}"
    failure = last_failure(deployment)
    if goal is Goal.UNLOADED:
        line = f"{head}: {len(loaded)} residency(ies) still loaded{detail}"
        if deployment.state == _D.DEPLOYMENT_STATE_UNLOADED:
            return Observation(line=line, settled=True)
        if deployment.state == _D.DEPLOYMENT_STATE_FAILED:
            return Observation(line=line, settled=False, failure=failure or "no reason recorded")
        return Observation(line=line, settled=False, waiting_for="UNLOADED")
    wanted = deployment.replicas
    line = f"{head}: {resident}/{wanted} resident{detail}"
    if deployment.HasField("deleted_at"):
        return Observation(line=line, settled=False, failure="it was deleted")
    if deployment.state == _D.DEPLOYMENT_STATE_FAILED:
        return Observation(line=line, settled=False, failure=failure or "no reason recorded")
    if deployment.state in (_D.DEPLOYMENT_STATE_UNLOADING, _D.DEPLOYMENT_STATE_UNLOADED):
        return Observation(line=line, settled=False, failure=f"it is {state} (unloaded meanwhile)")
    # Settled: READY, exactly the wanted replicas loaded and each RESIDENT (a surplus drained).
    if deployment.state == _D.DEPLOYMENT_STATE_READY and resident == len(loaded) == wanted:
        return Observation(line=line, settled=True)
    if failure:
        # Still trying (a placement refused for now, an infrastructure failure retried): said,
        # not fatal; the deployment FAILS by itself when retrying cannot help.
        line += f"; last failure {failure}"
    return Observation(
        line=line,
        settled=False,
        waiting_for=f"READY with {wanted} RESIDENT replica(s) ({resident} so far)",
    )


def wait_for_deployment(
    stub: control_plane_pb2_grpc.ControlPlaneStub,
    metadata: Metadata,
    deployment_id: str,
    *,
    goal: Goal,
    timeout_s: float,
    say: Say,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> control_plane_pb2.Deployment:
    """Poll until the goal is reached (the last answer), or raise CliError on a failure (with its
    reason and message) or at the timeout (saying what it still waits for)."""
    started = clock()
    said, said_at = "", started
    request = control_plane_pb2.GetDeploymentRequest(deployment_id=deployment_id)
    while True:
        deployment = stub.GetDeployment(request, metadata=metadata, timeout=CALL_TIMEOUT_S)
        seen = observe(deployment, goal)
        now = clock()
        if seen.line != said or now - said_at >= REMIND_EVERY_S:
            say(f"{seen.line} ({now - started:.0f}s)")
            said, said_at = seen.line, now
        if seen.settled:
            return deployment
        if seen.failure:
            raise CliError(f"deployment {deployment_id} will not be {goal.value}: {seen.failure}")
        if now - started >= timeout_s:
            raise CliError(
                f"deployment {deployment_id} is still {deployment_state(deployment)} after"
                f" {timeout_s:g}s; waiting for {seen.waiting_for}"
            )
        sleep(POLL_INTERVAL_S)

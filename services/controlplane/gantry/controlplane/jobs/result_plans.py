"""What a LOAD's or an UNLOAD's committed result means for its residency and deployment. Pure.

Each `plan_*` takes the snapshot its handler read (jobs/handlers.py) and returns the actions
(jobs/actions.py) the executor applies in the result's transaction:
- a LOAD that loaded makes its residency RESIDENT (unless an unload overtook it) and clears the
  deployment's failure count, but only once its evidence matches what the job asked for
  (`check_load_evidence`: the manifest digest, the verified file and byte counts, a stated
  isolation that meets the required one); evidence that does not is a failed load
  (LOAD_EVIDENCE_MISMATCH), audited. An adopted endpoint has no artifact: nothing to compare;
- a LOAD that failed makes a LOADING residency COLD with the worker's reason, counts one more
  attempt (not for a worker that was full), and, for a deployment still before its first load,
  either FAILS it (a non-INFRA failure, or the INFRA attempts are spent) or records why it waits.
  A failed start whose child the worker could not prove gone (its failure's `reclaim` metadata:
  unverified) makes it UNCERTAIN instead (RECLAIM_UNVERIFIED, charged, audited) until an UNLOAD
  proves it;
- an UNLOAD that the worker confirms exited, with its reclaim verified (reaped, and on a GPU
  NVML read and no longer listing the pid: the worker's `reclaim_verdict`), makes the residency
  COLD; one it could not confirm, or whose reclaim is unverified, makes it UNCERTAIN
  (RECLAIM_UNVERIFIED: custody is not over, its envelope stays charged) and is audited. Either
  way the deployment is UNLOADED once nothing of it is left, else settled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gantry.common.errors import FailureClass
from gantry.controlplane.endpoints.store import ORIGIN_ADOPTED
from gantry.controlplane.jobs import actions as act
from gantry.controlplane.jobs.context import failure_class
from gantry.controlplane.platform.state_machines import DeploymentState, ResidencyState

# Consecutive INFRA-class load failures after which a deployment FAILS rather than retrying.
MAX_LOAD_ATTEMPTS = 3
# What a worker answers a LOAD when it already holds its --max-residents model hosts.
NO_ROOM_ON_WORKER = "NO_CAPACITY"


@dataclass(frozen=True, slots=True, kw_only=True)
class Loaded:
    """What the worker loaded, as its result says (and the artifact digest Gantry verified)."""

    pid: int
    generation: int  # the worker generation whose result was just committed
    artifact_digest: str  # empty for an adopted server: no bytes Gantry verified
    adapter_digest: str
    environment_fingerprint: str


# Landlock levels a model host reports, weakest first (the worker's `IsolationLevel`), and the
# suffix it appends when the seccomp socket filter is in place too.
ISOLATION_LEVELS = ("NONE", "LANDLOCK_FS", "LANDLOCK_FS_NET")
SECCOMP_NET_SUFFIX = "+SECCOMP_NET"
# What the control plane requires of a host's isolation: stated, and at least this. Nothing
# declares a stronger requirement on the control plane's side yet (the worker's own
# `--require-isolation` refuses weaker hosts before they start).
REQUIRED_ISOLATION = "NONE"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportedLoad:
    """What a LOAD's evidence claims about the bytes and the host."""

    manifest_digest: str
    files_verified: int
    bytes_verified: int
    isolation: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpectedLoad:
    """What the job asked for: its artifact set's manifest, and the isolation required."""

    manifest_digest: str
    file_count: int
    total_size_bytes: int
    required_isolation: str = REQUIRED_ISOLATION


def _isolation_rank(wire: str) -> tuple[int, bool] | None:
    """(Landlock level, seccomp filter) of an isolation as the wire spells it; None: unknown."""
    level, seccomp = wire.removesuffix(SECCOMP_NET_SUFFIX), wire.endswith(SECCOMP_NET_SUFFIX)
    if level not in ISOLATION_LEVELS:
        return None
    return ISOLATION_LEVELS.index(level), seccomp


def check_load_evidence(reported: ReportedLoad, expected: ExpectedLoad) -> str:
    """Why the evidence does not match the job ("" when it does). Whoever holds a node's
    credential can answer a LOAD; what it claims must at least be what was asked for."""
    if reported.manifest_digest != expected.manifest_digest:
        return (
            f"the evidence names manifest digest {reported.manifest_digest[:64]!r}, the job "
            f"asked for {expected.manifest_digest!r}"
        )
    if (reported.files_verified, reported.bytes_verified) != (
        expected.file_count,
        expected.total_size_bytes,
    ):
        return (
            f"the evidence verified {reported.files_verified} files and {reported.bytes_verified}"
            f" bytes; the artifact set holds {expected.file_count} files and "
            f"{expected.total_size_bytes} bytes"
        )
    rank, required = (
        _isolation_rank(reported.isolation),
        _isolation_rank(expected.required_isolation),
    )
    assert required is not None, expected.required_isolation
    if rank is None:
        return f"the evidence states no known isolation ({reported.isolation[:64]!r})"
    if rank[0] < required[0] or (required[1] and not rank[1]):
        return (
            f"the host's isolation {reported.isolation} is weaker than the required "
            f"{expected.required_isolation}"
        )
    return ""


# The reason a LOAD whose evidence does not match its job fails with.
EVIDENCE_MISMATCH = "LOAD_EVIDENCE_MISMATCH"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadResultSnapshot:
    residency_id: str
    residency_state: ResidencyState
    deployment_id: str
    origin: str
    load_failure_count: int
    loaded: Loaded | None  # None: the load failed, for `failure_reason`
    failure_reason: str = ""
    failure_message: str = ""
    node_id: str = ""
    # What a loaded result's evidence claims, and what its job asked for (None: an adopted
    # endpoint, no artifact to compare).
    reported: ReportedLoad | None = None
    expected: ExpectedLoad | None = None
    # A failed start whose child the worker could not prove gone: why ("" when proven, or when
    # no process was started).
    reclaim_unverified: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class UnloadResultSnapshot:
    residency_id: str
    residency_state: ResidencyState
    node_id: str
    deployment_id: str
    deployment_state: DeploymentState
    # Every residency of the deployment (this one included) and its state before this result.
    residency_states: tuple[tuple[str, ResidencyState], ...]
    process_exited: bool  # the worker confirmed the process was reaped
    failure_reason: str | None = None  # the worker's typed failure, when it answered with one
    failure_message: str = ""
    # The worker's reclaim check said unverified (the reclaim's detail says why): the process
    # is gone but its device memory is not proven back. "" when verified, or none was needed.
    reclaim_unverified: str = ""


def load_gives_up(failure_reason: str, *, load_failure_count: int, origin: str) -> bool:
    """Whether a failed LOAD fails its deployment instead of being retried."""
    # A worker that was full when the LOAD came (placement read the node before a host it
    # still held was gone) refused to start anything: a placement answer, not a failed load.
    # The residency is COLD again and the reconciler places the deployment when room appears.
    if failure_reason == NO_ROOM_ON_WORKER:
        return False
    # An adopted server that is down is the operator's to bring back, and it comes back by
    # itself: its LOAD is asked again (reconciler, with backoff) for as long as it is wanted,
    # so it never FAILS for attempts. Nothing of ours is broken by retrying it.
    return failure_class(failure_reason) is not FailureClass.INFRA or (
        load_failure_count >= MAX_LOAD_ATTEMPTS and origin != ORIGIN_ADOPTED
    )


def plan_load_result(snapshot: LoadResultSnapshot) -> tuple[act.Action, ...]:
    if snapshot.loaded is not None:
        mismatch = _evidence_mismatch(snapshot)
        if mismatch:
            return _plan_evidence_refused(snapshot, mismatch)
        return _plan_loaded(snapshot, snapshot.loaded)
    return _plan_load_failed(snapshot)


def _evidence_mismatch(snapshot: LoadResultSnapshot) -> str:
    if snapshot.expected is None:
        return ""  # an adopted endpoint: Gantry verified no bytes, there is nothing to compare
    if snapshot.reported is None:
        return "the result carries no load evidence"
    return check_load_evidence(snapshot.reported, snapshot.expected)


def _plan_evidence_refused(snapshot: LoadResultSnapshot, mismatch: str) -> tuple[act.Action, ...]:
    """A loaded result whose evidence does not match its job: a failed load, and audited."""
    refused = replace(
        snapshot, loaded=None, failure_reason=EVIDENCE_MISMATCH, failure_message=mismatch
    )
    audit = act.Audit(
        actor=f"node:{snapshot.node_id}",
        action="load.evidence_refused",
        subject_kind="residency",
        subject_id=snapshot.residency_id,
        detail=(("reason", EVIDENCE_MISMATCH), ("message", mismatch)),
    )
    return (*_plan_load_failed(refused), audit)


def _plan_loaded(snapshot: LoadResultSnapshot, loaded: Loaded) -> tuple[act.Action, ...]:
    if snapshot.residency_state not in (ResidencyState.LOADING, ResidencyState.RESIDENT):
        return ()  # an unload overtook this load; the unload settles the residency
    return (
        act.MarkResident(
            residency_id=snapshot.residency_id,
            pid=loaded.pid,
            generation=loaded.generation,
            artifact_digest=loaded.artifact_digest,
            adapter_digest=loaded.adapter_digest,
            environment_fingerprint=loaded.environment_fingerprint,
        ),
        act.SetLoadFailures(deployment_id=snapshot.deployment_id, count=0),
        act.Settle(deployment_id=snapshot.deployment_id),
    )


def _plan_load_failed(snapshot: LoadResultSnapshot) -> tuple[act.Action, ...]:
    reason, message = snapshot.failure_reason, snapshot.failure_message
    planned: list[act.Action] = []
    if snapshot.residency_state == ResidencyState.LOADING:
        planned.extend(_release_failed_load(snapshot))
    count = snapshot.load_failure_count
    # Refused for room: not counted as an attempt (load_gives_up says why).
    if reason != NO_ROOM_ON_WORKER:
        count += 1
        planned.append(act.SetLoadFailures(deployment_id=snapshot.deployment_id, count=count))
    planned.append(act.Settle(deployment_id=snapshot.deployment_id))
    # Settling may move the deployment: the guard reads its state after it.
    if load_gives_up(reason, load_failure_count=count, origin=snapshot.origin):
        # A configuration error will not heal by retrying; an INFRA one gets a few attempts.
        planned.append(
            act.FailDeployment(
                deployment_id=snapshot.deployment_id,
                reason=reason,
                message=message,
                only_from=act.BEFORE_FIRST_LOAD,
            )
        )
    else:
        planned.append(
            act.SetDeploymentState(
                deployment_id=snapshot.deployment_id,
                state=None,
                reason=reason,
                message=message,
                only_from=act.BEFORE_FIRST_LOAD,
            )
        )
    return tuple(planned)


def _release_failed_load(snapshot: LoadResultSnapshot) -> tuple[act.Action, ...]:
    """COLD once the worker proved the failed start's child gone; UNCERTAIN, still charged,
    while it could not (the reconciler's UNLOADs ask again, with backoff)."""
    reason, message = snapshot.failure_reason, snapshot.failure_message
    if not snapshot.reclaim_unverified:
        return (act.mark_cold(snapshot.residency_id, reason=reason, message=message),)
    return (
        act.MarkResidency(
            residency_id=snapshot.residency_id,
            state=ResidencyState.UNCERTAIN,
            reason="RECLAIM_UNVERIFIED",
            message=f"the load failed ({reason}), its process not proven gone: "
            f"{snapshot.reclaim_unverified}",
        ),
        act.Audit(
            actor=f"node:{snapshot.node_id}",
            action="residency.uncertain",
            subject_kind="residency",
            subject_id=snapshot.residency_id,
            detail=(("reason", "RECLAIM_UNVERIFIED"), ("load_failure", reason)),
        ),
    )


def plan_unload_result(snapshot: UnloadResultSnapshot) -> tuple[act.Action, ...]:
    planned: list[act.Action] = []
    now_state = snapshot.residency_state
    if snapshot.process_exited and not snapshot.reclaim_unverified:
        if now_state != ResidencyState.COLD:
            now_state = ResidencyState.COLD
            planned.append(
                act.MarkResidency(residency_id=snapshot.residency_id, state=now_state, pid=0)
            )
    else:
        # The process may still run: custody is not over. Its envelope stays charged and the
        # reconciler tries the unload again.
        if snapshot.failure_reason is not None:
            reason, message = snapshot.failure_reason, snapshot.failure_message
        elif snapshot.reclaim_unverified:
            reason, message = "RECLAIM_UNVERIFIED", snapshot.reclaim_unverified
        else:
            reason, message = "RECLAIM_UNVERIFIED", "the worker could not confirm the exit"
        if now_state != ResidencyState.UNCERTAIN:
            now_state = ResidencyState.UNCERTAIN
            planned.append(
                act.MarkResidency(
                    residency_id=snapshot.residency_id,
                    state=now_state,
                    reason=reason,
                    message=message,
                )
            )
        planned.append(
            act.Audit(
                actor=f"node:{snapshot.node_id}",
                action="residency.uncertain",
                subject_kind="residency",
                subject_id=snapshot.residency_id,
                detail=(("reason", reason),),
            )
        )
    planned.append(_finish_unloading(snapshot, now_state))
    return tuple(planned)


def _finish_unloading(snapshot: UnloadResultSnapshot, now_state: ResidencyState) -> act.Action:
    remaining = [
        residency_id
        for residency_id, state in _with_state(
            snapshot.residency_states, snapshot.residency_id, now_state
        )
        if state != ResidencyState.COLD
    ]
    if not remaining and snapshot.deployment_state == DeploymentState.UNLOADING:
        return act.SetDeploymentState(
            deployment_id=snapshot.deployment_id, state=DeploymentState.UNLOADED
        )
    return act.Settle(deployment_id=snapshot.deployment_id)


def _with_state(
    states: Sequence[tuple[str, ResidencyState]], residency_id: str, state: ResidencyState
) -> list[tuple[str, ResidencyState]]:
    """The residencies' states once `residency_id` is in `state`."""
    return [(rid, state if rid == residency_id else old) for rid, old in states]

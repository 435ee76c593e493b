"""The reconciler's pure plans (deployments/reconciler_plans.py), one scenario per rule."""

from __future__ import annotations

import datetime as dt
import typing

from gantry.controlplane.deployments.reconciler_plans import (
    AbsentNode,
    AdoptedResidency,
    ResidencyJobs,
    StaleCandidate,
    UncertainResidency,
    awaiting_reload,
    plan_disconnect,
    plan_forget_absent,
    plan_reload_adopted,
    plan_retry_uncertain,
)
from gantry.controlplane.endpoints.reload_rules import AdoptedResidencyFacts
from gantry.controlplane.jobs import actions as act
from gantry.controlplane.nodes.liveness import Heard
from gantry.controlplane.platform.state_machines import DeploymentState, NodeState, ResidencyState

T0 = dt.datetime(2026, 12, 5, 3, 0, tzinfo=dt.UTC)
HEARD = Heard(node_id="n1", generation=4, heard_at=T0)
COLD, LOADING, RESIDENT = ResidencyState.COLD, ResidencyState.LOADING, ResidencyState.RESIDENT


def candidate(**overrides: typing.Any) -> StaleCandidate:
    facts: dict[str, typing.Any] = dict(
        node_id="n1",
        state=NodeState.CONNECTED,
        generation=4,
        last_seen_at=T0 - dt.timedelta(seconds=30),
        heard=None,
        last_heard=None,
        tracked=False,
    )
    return StaleCandidate(**(facts | overrides))


# ---- stale nodes --------------------------------------------------------------------------


def test_a_stale_node_without_a_stream_here_is_disconnected_keeping_its_last_seen_time():
    assert plan_disconnect(candidate()) == (act.DisconnectNode(node_id="n1"),)


def test_an_old_row_of_a_node_whose_stream_is_here_is_not_stale_yet():
    assert plan_disconnect(candidate(tracked=True)) == ()


def test_a_silent_stream_disconnects_its_node_with_the_later_of_both_times():
    planned = plan_disconnect(candidate(heard=HEARD, last_heard=HEARD, tracked=True))
    assert planned == (act.DisconnectNode(node_id="n1", last_seen_at=T0, heard=HEARD),)
    newer_row = candidate(
        heard=HEARD, last_heard=HEARD, last_seen_at=T0 + dt.timedelta(seconds=1), tracked=True
    )
    assert plan_disconnect(newer_row)[0].last_seen_at == T0 + dt.timedelta(seconds=1)
    assert plan_disconnect(candidate(heard=HEARD, last_heard=HEARD, last_seen_at=None)) == (
        act.DisconnectNode(node_id="n1", last_seen_at=T0, heard=HEARD),
    )


def test_a_heartbeat_heard_since_keeps_the_node_connected():
    later = Heard(node_id="n1", generation=4, heard_at=T0 + dt.timedelta(seconds=1))
    assert plan_disconnect(candidate(heard=HEARD, last_heard=later, tracked=True)) == ()


def test_a_silent_stream_of_an_older_generation_does_not_disconnect_the_new_one():
    assert plan_disconnect(candidate(generation=5, heard=HEARD, last_heard=HEARD)) == ()


def test_a_node_already_disconnected_or_disabled_is_left_alone():
    for state in (NodeState.DISCONNECTED, NodeState.DISABLED):
        assert plan_disconnect(candidate(state=state)) == ()


# ---- absent nodes -------------------------------------------------------------------------


def absent(*residencies: ResidencyJobs, stream_open: bool = False) -> AbsentNode:
    return AbsentNode(
        node_id="n1", last_seen_at=T0, stream_open=stream_open, residencies=residencies
    )


def test_an_absent_node_loses_its_residencies_their_jobs_and_its_pipeline_work():
    message = f"node n1 absent since {T0}"
    planned = plan_forget_absent(
        [
            absent(
                ResidencyJobs(
                    residency_id="r1", deployment_id="d1", state=RESIDENT, open_job_ids=("j1", "j2")
                ),
                ResidencyJobs(residency_id="r2", deployment_id="d2", state=COLD, open_job_ids=()),
            )
        ]
    )
    assert planned == (
        act.AbandonPipelineJobs(node_id="n1", reason="WORKER_UNAVAILABLE", message=message),
        act.CancelJob(job_id="j1"),
        act.CancelJob(job_id="j2"),
        act.MarkResidency(
            residency_id="r1", state=COLD, reason="WORKER_UNAVAILABLE", message=message, pid=0
        ),
        act.Settle(deployment_id="d1"),
        act.Audit(
            actor="reconciler",
            action="residency.lost",
            subject_kind="residency",
            subject_id="r1",
            detail=(("node_id", "n1"),),
        ),
    )


def test_a_disabled_node_whose_worker_is_still_connected_is_not_absent():
    residency = ResidencyJobs(
        residency_id="r1", deployment_id="d1", state=RESIDENT, open_job_ids=()
    )
    assert plan_forget_absent([absent(residency, stream_open=True)]) == ()


# ---- adopted endpoints --------------------------------------------------------------------


def adopted(state: ResidencyState, *, wanted: bool = True, due: bool = True) -> AdoptedResidency:
    facts = AdoptedResidencyFacts(
        deployment_state=DeploymentState.DEGRADED,
        deployment_deleted=False,
        residency_state=state,
        node_state=NodeState.CONNECTED if wanted else NodeState.DISCONNECTED,
        node_stream_open=wanted,
        open_job=False,
    )
    return AdoptedResidency(
        deployment_id="d1",
        residency_id=f"r-{state}",
        node_id="n1",
        state=state,
        facts=facts if state == COLD else None,
        due=due,
    )


def test_a_cold_adopted_endpoint_on_a_connected_node_is_loaded_again():
    assert plan_reload_adopted([adopted(COLD)]) == (
        act.QueueLoad(deployment_id="d1", residency_id="r-COLD", node_id="n1"),
        act.Settle(deployment_id="d1"),
    )


def test_a_cold_adopted_endpoint_is_not_loaded_while_its_node_is_away_or_backing_off():
    assert plan_reload_adopted([adopted(COLD, wanted=False)]) == ()
    assert plan_reload_adopted([adopted(COLD, due=False)]) == ()


def test_a_loading_or_resident_endpoint_is_not_loaded_and_only_the_resident_leaves_backoff():
    residencies = [adopted(LOADING), adopted(RESIDENT), adopted(COLD, due=False)]
    assert plan_reload_adopted(residencies) == ()
    assert awaiting_reload(residencies) == {"r-LOADING", "r-COLD"}


# ---- uncertain residencies ----------------------------------------------------------------


def uncertain(**overrides: typing.Any) -> UncertainResidency:
    facts: dict[str, typing.Any] = dict(
        residency_id="r1", node_id="n1", stream_open=True, open_job=False, due=True
    )
    return UncertainResidency(**(facts | overrides))


def test_an_uncertain_residency_gets_another_unload_when_due():
    assert plan_retry_uncertain([uncertain()]) == (
        act.QueueUnload(residency_id="r1", node_id="n1"),
    )


def test_no_unload_is_retried_without_its_worker_with_one_open_or_before_its_backoff():
    for overrides in ({"stream_open": False}, {"open_job": True}, {"due": False}):
        assert plan_retry_uncertain([uncertain(**overrides)]) == ()

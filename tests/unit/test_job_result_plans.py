"""What a LOAD's or an UNLOAD's result plans (jobs/result_plans.py), and the executor's table."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from gantry.controlplane.endpoints.store import ORIGIN_ADOPTED, ORIGIN_PIPELINE
from gantry.controlplane.jobs import actions as act
from gantry.controlplane.jobs.executor import _APPLY
from gantry.controlplane.jobs.result_plans import (
    MAX_LOAD_ATTEMPTS,
    NO_ROOM_ON_WORKER,
    Loaded,
    LoadResultSnapshot,
    UnloadResultSnapshot,
    plan_load_result,
    plan_unload_result,
)
from gantry.controlplane.platform.state_machines import DeploymentState, ResidencyState

COLD, LOADING, RESIDENT, UNCERTAIN, UNLOADING = (
    ResidencyState.COLD,
    ResidencyState.LOADING,
    ResidencyState.RESIDENT,
    ResidencyState.UNCERTAIN,
    ResidencyState.UNLOADING,
)
LOADED = Loaded(
    pid=41,
    generation=7,
    artifact_digest="sha256:a",
    adapter_digest="sha256:b",
    environment_fingerprint="env",
)


def load_snapshot(**overrides: typing.Any) -> LoadResultSnapshot:
    facts: dict[str, typing.Any] = dict(
        residency_id="r1",
        residency_state=LOADING,
        deployment_id="d1",
        origin=ORIGIN_PIPELINE,
        load_failure_count=0,
        loaded=None,
        failure_reason="LOAD_FAILED",
        failure_message="the host exited",
    )
    return LoadResultSnapshot(**(facts | overrides))


def unload_snapshot(**overrides: typing.Any) -> UnloadResultSnapshot:
    facts: dict[str, typing.Any] = dict(
        residency_id="r1",
        residency_state=UNLOADING,
        node_id="n1",
        deployment_id="d1",
        deployment_state=DeploymentState.UNLOADING,
        residency_states=(("r1", UNLOADING),),
        process_exited=True,
    )
    return UnloadResultSnapshot(**(facts | overrides))


def fail(**fields: typing.Any) -> act.FailDeployment:
    return act.FailDeployment(deployment_id="d1", only_from=act.BEFORE_FIRST_LOAD, **fields)


def wait(**fields: typing.Any) -> act.SetDeploymentState:
    return act.SetDeploymentState(
        deployment_id="d1", state=None, only_from=act.BEFORE_FIRST_LOAD, **fields
    )


def test_every_action_type_has_exactly_one_write_in_the_executor():
    assert set(typing.get_args(act.Action)) == set(_APPLY)
    assert all(dataclasses.is_dataclass(kind) for kind in _APPLY)


# ---- LOAD ---------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [LOADING, RESIDENT])
def test_a_load_that_loaded_makes_the_residency_resident_and_clears_the_failures(state):
    planned = plan_load_result(load_snapshot(residency_state=state, loaded=LOADED))
    assert planned == (
        act.MarkResident(
            residency_id="r1",
            pid=41,
            generation=7,
            artifact_digest="sha256:a",
            adapter_digest="sha256:b",
            environment_fingerprint="env",
        ),
        act.SetLoadFailures(deployment_id="d1", count=0),
        act.Settle(deployment_id="d1"),
    )


@pytest.mark.parametrize("state", [COLD, UNLOADING, UNCERTAIN])
def test_a_load_overtaken_by_an_unload_changes_nothing(state):
    assert plan_load_result(load_snapshot(residency_state=state, loaded=LOADED)) == ()


def test_an_infra_failure_under_the_attempt_limit_is_retried_with_its_reason_recorded():
    planned = plan_load_result(load_snapshot(load_failure_count=MAX_LOAD_ATTEMPTS - 2))
    assert planned == (
        act.MarkResidency(
            residency_id="r1", state=COLD, reason="LOAD_FAILED", message="the host exited", pid=0
        ),
        act.SetLoadFailures(deployment_id="d1", count=MAX_LOAD_ATTEMPTS - 1),
        act.Settle(deployment_id="d1"),
        wait(reason="LOAD_FAILED", message="the host exited"),
    )


def test_an_infra_failure_at_the_attempt_limit_fails_the_deployment():
    planned = plan_load_result(load_snapshot(load_failure_count=MAX_LOAD_ATTEMPTS - 1))
    assert planned[1] == act.SetLoadFailures(deployment_id="d1", count=MAX_LOAD_ATTEMPTS)
    assert planned[-1] == fail(reason="LOAD_FAILED", message="the host exited")


def test_a_configuration_failure_fails_the_deployment_at_the_first_attempt():
    planned = plan_load_result(
        load_snapshot(failure_reason="RUNTIME_INCOMPATIBLE", failure_message="no adapter")
    )
    assert planned[1] == act.SetLoadFailures(deployment_id="d1", count=1)
    assert planned[-1] == fail(reason="RUNTIME_INCOMPATIBLE", message="no adapter")


def test_an_unknown_reason_counts_as_infra():
    planned = plan_load_result(load_snapshot(failure_reason="SOMETHING_NEW"))
    assert planned[-1] == wait(reason="SOMETHING_NEW", message="the host exited")


def test_a_full_worker_is_not_an_attempt_and_never_fails_the_deployment():
    planned = plan_load_result(
        load_snapshot(
            failure_reason=NO_ROOM_ON_WORKER,
            failure_message="full",
            load_failure_count=MAX_LOAD_ATTEMPTS + 5,
        )
    )
    assert not any(isinstance(action, act.SetLoadFailures) for action in planned)
    assert planned[-1] == wait(reason=NO_ROOM_ON_WORKER, message="full")


def test_an_adopted_server_that_is_down_is_retried_past_the_attempt_limit():
    planned = plan_load_result(
        load_snapshot(origin=ORIGIN_ADOPTED, load_failure_count=MAX_LOAD_ATTEMPTS + 1)
    )
    assert planned[-1] == wait(reason="LOAD_FAILED", message="the host exited")


def test_a_failed_load_of_a_residency_no_longer_loading_leaves_the_residency_alone():
    planned = plan_load_result(load_snapshot(residency_state=UNLOADING))
    assert not any(isinstance(action, act.MarkResidency) for action in planned)
    assert planned[0] == act.SetLoadFailures(deployment_id="d1", count=1)


# ---- UNLOAD -------------------------------------------------------------------------------


def test_a_confirmed_unload_of_the_last_residency_unloads_the_deployment():
    assert plan_unload_result(unload_snapshot()) == (
        act.MarkResidency(residency_id="r1", state=COLD, pid=0),
        act.SetDeploymentState(deployment_id="d1", state=DeploymentState.UNLOADED),
    )


def test_a_confirmed_unload_with_another_residency_left_settles_instead():
    planned = plan_unload_result(
        unload_snapshot(residency_states=(("r1", UNLOADING), ("r2", UNLOADING)))
    )
    assert planned[-1] == act.Settle(deployment_id="d1")


def test_a_confirmed_unload_of_a_still_wanted_deployment_settles_it():
    planned = plan_unload_result(
        unload_snapshot(deployment_state=DeploymentState.READY, residency_states=(("r1", COLD),))
    )
    assert planned == (
        act.MarkResidency(residency_id="r1", state=COLD, pid=0),
        act.Settle(deployment_id="d1"),
    )


def test_an_unload_of_a_residency_already_cold_writes_no_residency():
    planned = plan_unload_result(
        unload_snapshot(residency_state=COLD, residency_states=(("r1", COLD),))
    )
    assert planned == (act.SetDeploymentState(deployment_id="d1", state=DeploymentState.UNLOADED),)


def test_an_unconfirmed_exit_is_uncertain_and_audited():
    planned = plan_unload_result(unload_snapshot(process_exited=False))
    assert planned == (
        act.MarkResidency(
            residency_id="r1",
            state=UNCERTAIN,
            reason="RECLAIM_UNVERIFIED",
            message="the worker could not confirm the exit",
        ),
        act.Audit(
            actor="node:n1",
            action="residency.uncertain",
            subject_kind="residency",
            subject_id="r1",
            detail=(("reason", "RECLAIM_UNVERIFIED"),),
        ),
        # Still held: the deployment is not UNLOADED yet.
        act.Settle(deployment_id="d1"),
    )


def test_an_unload_failure_keeps_the_workers_reason():
    planned = plan_unload_result(
        unload_snapshot(process_exited=False, failure_reason="", failure_message="")
    )
    assert planned[0] == act.MarkResidency(residency_id="r1", state=UNCERTAIN, reason="")


def test_an_uncertain_residency_uncertain_again_is_only_audited():
    planned = plan_unload_result(
        unload_snapshot(
            residency_state=UNCERTAIN,
            residency_states=(("r1", UNCERTAIN),),
            process_exited=False,
            failure_reason="RUNTIME_UNRESPONSIVE",
            failure_message="no answer",
        )
    )
    assert [type(action) for action in planned] == [act.Audit, act.Settle]
    assert planned[0].detail == (("reason", "RUNTIME_UNRESPONSIVE"),)  # type: ignore[union-attr]


def test_an_exit_whose_reclaim_is_unverified_is_uncertain_with_the_workers_why():
    # Reaped, but on a GPU NVML could not be read: not COLD, the envelope stays charged.
    why = "pid 41 exited with code 0, reaped; unverified: NVML could not be read"
    planned = plan_unload_result(unload_snapshot(process_exited=True, reclaim_unverified=why))
    assert planned[0] == act.MarkResidency(
        residency_id="r1", state=UNCERTAIN, reason="RECLAIM_UNVERIFIED", message=why
    )
    assert isinstance(planned[1], act.Audit)
    assert planned[-1] == act.Settle(deployment_id="d1")  # not UNLOADED: still held


def test_a_failed_load_whose_child_is_not_proven_gone_is_uncertain_not_cold():
    planned = plan_load_result(
        load_snapshot(node_id="n1", reclaim_unverified="pid 41 of a failed start: NVML ...")
    )
    assert planned[0] == act.MarkResidency(
        residency_id="r1",
        state=UNCERTAIN,
        reason="RECLAIM_UNVERIFIED",
        message="the load failed (LOAD_FAILED), its process not proven gone: "
        "pid 41 of a failed start: NVML ...",
    )
    assert planned[1] == act.Audit(
        actor="node:n1",
        action="residency.uncertain",
        subject_kind="residency",
        subject_id="r1",
        detail=(("reason", "RECLAIM_UNVERIFIED"), ("load_failure", "LOAD_FAILED")),
    )
    # The attempt still counts, as for any failed load.
    assert act.SetLoadFailures(deployment_id="d1", count=1) in planned
    assert not any(isinstance(a, act.MarkResidency) and a.state == COLD for a in planned)


def test_a_failed_load_proven_gone_is_cold():
    planned = plan_load_result(load_snapshot())
    assert planned[0] == act.mark_cold("r1", reason="LOAD_FAILED", message="the host exited")

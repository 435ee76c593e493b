"""A LOAD's evidence is checked against what its job asked for before anything becomes RESIDENT
(jobs/result_plans.py: `check_load_evidence`, and the plan that refuses a mismatch)."""

from __future__ import annotations

import dataclasses

import pytest

from gantry.common.errors import REASONS, FailureClass
from gantry.controlplane.endpoints.store import ORIGIN_PIPELINE
from gantry.controlplane.jobs import actions as act
from gantry.controlplane.jobs.result_plans import (
    EVIDENCE_MISMATCH,
    ExpectedLoad,
    Loaded,
    LoadResultSnapshot,
    ReportedLoad,
    check_load_evidence,
    plan_load_result,
)
from gantry.controlplane.platform.state_machines import ResidencyState

EXPECTED = ExpectedLoad(manifest_digest="a" * 64, file_count=3, total_size_bytes=1000)
HONEST = ReportedLoad(
    manifest_digest="a" * 64, files_verified=3, bytes_verified=1000, isolation="LANDLOCK_FS"
)
LOADED = Loaded(
    pid=41, generation=7, artifact_digest="a" * 64, adapter_digest="b", environment_fingerprint="e"
)
# What the review's impostor sent: no digest, nothing verified, no isolation.
FAKE = ReportedLoad(manifest_digest="", files_verified=0, bytes_verified=0, isolation="")


def snapshot(reported: ReportedLoad | None, expected: ExpectedLoad | None) -> LoadResultSnapshot:
    return LoadResultSnapshot(
        residency_id="r1",
        residency_state=ResidencyState.LOADING,
        deployment_id="d1",
        origin=ORIGIN_PIPELINE,
        load_failure_count=0,
        loaded=LOADED,
        node_id="n1",
        reported=reported,
        expected=expected,
    )


def test_honest_evidence_matches():
    assert check_load_evidence(HONEST, EXPECTED) == ""
    sandboxed = dataclasses.replace(HONEST, isolation="LANDLOCK_FS_NET+SECCOMP_NET")
    required = dataclasses.replace(EXPECTED, required_isolation="LANDLOCK_FS_NET+SECCOMP_NET")
    assert check_load_evidence(sandboxed, required) == ""


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"manifest_digest": "b" * 64}, "manifest digest"),
        ({"manifest_digest": ""}, "manifest digest"),
        ({"files_verified": 2}, "2 files"),
        ({"bytes_verified": 999}, "999 bytes"),
        ({"isolation": ""}, "no known isolation"),
        ({"isolation": "SANDBOXED_PROMISE"}, "no known isolation"),
    ],
)
def test_evidence_that_is_not_what_the_job_asked_for_is_refused(change, says):
    assert says in check_load_evidence(dataclasses.replace(HONEST, **change), EXPECTED)


@pytest.mark.parametrize(
    ("isolation", "required"),
    [
        ("NONE", "LANDLOCK_FS"),
        ("LANDLOCK_FS", "LANDLOCK_FS_NET"),
        ("LANDLOCK_FS_NET", "LANDLOCK_FS_NET+SECCOMP_NET"),
    ],
)
def test_isolation_weaker_than_required_is_refused(isolation, required):
    reported = dataclasses.replace(HONEST, isolation=isolation)
    expected = dataclasses.replace(EXPECTED, required_isolation=required)
    assert "weaker than the required" in check_load_evidence(reported, expected)


def test_fake_evidence_fails_the_load_and_is_audited_instead_of_making_it_resident():
    planned = plan_load_result(snapshot(FAKE, EXPECTED))
    assert not any(isinstance(action, act.MarkResident) for action in planned)
    cold = planned[0]
    assert isinstance(cold, act.MarkResidency)
    assert (cold.state, cold.reason) == (ResidencyState.COLD, EVIDENCE_MISMATCH)
    assert act.SetLoadFailures(deployment_id="d1", count=1) in planned
    audit = planned[-1]
    assert isinstance(audit, act.Audit)
    assert (audit.actor, audit.action, audit.subject_id) == (
        "node:n1",
        "load.evidence_refused",
        "r1",
    )
    assert dict(audit.detail)["reason"] == EVIDENCE_MISMATCH


def test_a_mismatch_is_retried_like_an_infra_failure_not_failed_at_once():
    assert REASONS[EVIDENCE_MISMATCH].failure_class is FailureClass.INFRA
    planned = plan_load_result(snapshot(FAKE, EXPECTED))
    assert not any(isinstance(action, act.FailDeployment) for action in planned)


def test_honest_evidence_is_planned_as_before_and_an_adopted_endpoint_is_not_compared():
    honest = plan_load_result(snapshot(HONEST, EXPECTED))
    assert isinstance(honest[0], act.MarkResident)
    adopted = plan_load_result(snapshot(FAKE, None))
    assert isinstance(adopted[0], act.MarkResident)


def test_a_loaded_result_without_evidence_is_refused():
    planned = plan_load_result(snapshot(None, EXPECTED))
    assert isinstance(planned[0], act.MarkResidency)
    assert planned[0].reason == EVIDENCE_MISMATCH

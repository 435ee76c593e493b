"""The evidence pipeline's compare-and-set paths, run directly on both stores: two writers never
both win a probe move, measured peaks only rise, a candidate becomes production once, and a
pending binding moves in the transaction that makes its deployment READY."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pytest

from gantry.common.errors import GantryError
from gantry.common.manifest import ManifestEntry
from gantry.controlplane.artifacts import store as artifacts
from gantry.controlplane.deployments import bindings
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.evidence import assessments, candidates, probes, profiles
from gantry.controlplane.evidence.pipeline_states import CandidateStatus
from gantry.controlplane.evidence.probe_transitions import ProbeState
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.state_machines import DeploymentState
from gantry.controlplane.platform.transitions import lost_a_race

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


@dataclass
class Seeded:
    node_id: str
    artifact_set_id: str
    assessment_id: str
    profile_id: str


async def _seed(database: Database) -> Seeded:
    async with database.transaction() as session:
        node, _ = await nodes.register_node(session, name="n", labels={}, now=NOW)
        artifact = await artifacts.create_artifact_set(
            session,
            name="a",
            location="a",
            manifest=[ManifestEntry(path="model.safetensors", size_bytes=1, sha256="a" * 64)],
            now=NOW,
        )
        assessment = await assessments.create_assessment(
            session,
            artifact_set_id=artifact.artifact_set_id,
            node_id=node.node_id,
            environment_id="",
            now=NOW,
        )
        profile = await profiles.create_profile(
            session,
            name="p",
            assessment_id=assessment.assessment_id,
            artifact_set_id=artifact.artifact_set_id,
            environment_id="",
            adapter={"adapter": "sentence_transformers"},
            ram_estimate_bytes=100,
            vram_estimate_bytes=0,
            created_by="op",
            now=NOW,
        )
        return Seeded(
            node.node_id, artifact.artifact_set_id, assessment.assessment_id, profile.profile_id
        )


async def test_two_writers_moving_one_probe_cannot_both_win(database: Database):
    seeded = await _seed(database)
    async with database.transaction() as session:
        probe = await probes.create_probe(
            session, profile_id=seeded.profile_id, node_id=seeded.node_id, now=NOW
        )
    async with database.transaction() as session:
        first = await probes.get_probe(session, probe.probe_id)
    async with database.transaction() as session:
        second = await probes.get_probe(session, probe.probe_id)
    async with database.transaction() as session:
        session.add(first)
        await probes.move_probe(session, first, ProbeState.PREPARING, now=NOW)
    # The second writer read QUEUED too; its cancel must not overwrite the move it did not see.
    with pytest.raises(GantryError) as caught:
        async with database.transaction() as session:
            session.add(second)
            await probes.end_probe(
                session, second, ProbeState.CANCELLED, reason="", message="", now=NOW
            )
    assert lost_a_race(caught.value)
    async with database.transaction() as session:
        current = await probes.get_probe(session, probe.probe_id)
        assert current.state == ProbeState.PREPARING
        # An illegal move is refused by the table before any UPDATE.
        with pytest.raises(GantryError) as illegal:
            await probes.move_probe(session, current, ProbeState.READY, now=NOW)
        assert illegal.value.reason == "INVALID_STATE_TRANSITION"
        assert not lost_a_race(illegal.value)


async def test_measured_peaks_only_ever_rise(database: Database):
    seeded = await _seed(database)
    for ram, vram in ((300, None), (200, 50), (None, 40), (400, 60)):
        async with database.transaction() as session:
            profile = await profiles.get_profile(session, seeded.profile_id)
            await profiles.raise_measured_peaks(
                session, profile, ram_peak_bytes=ram, vram_peak_bytes=vram
            )
    async with database.transaction() as session:
        profile = await profiles.get_profile(session, seeded.profile_id)
    assert (profile.ram_measured_peak_bytes, profile.vram_measured_peak_bytes) == (400, 60)
    assert (profile.ram_estimate_bytes, profile.vram_estimate_bytes) == (100, 0)


async def test_a_candidate_is_made_production_once(database: Database):
    seeded = await _seed(database)
    async with database.transaction() as session:
        probe = await probes.create_probe(
            session, profile_id=seeded.profile_id, node_id=seeded.node_id, now=NOW
        )
        candidate = await candidates.create_candidate(
            session,
            probe_id=probe.probe_id,
            profile_id=seeded.profile_id,
            artifact_set_id=seeded.artifact_set_id,
            status=CandidateStatus.LAB_READY,
            reasons=[],
            now=NOW,
        )
    async with database.transaction() as session:
        stale = await candidates.get_candidate(session, candidate.candidate_id)
    async with database.transaction() as session:
        await candidates.mark_production(
            session, await candidates.get_candidate(session, candidate.candidate_id)
        )
    with pytest.raises(GantryError) as caught:
        async with database.transaction() as session:
            session.add(stale)
            await candidates.mark_production(session, stale)
    assert lost_a_race(caught.value)


async def test_a_pending_binding_moves_in_the_transaction_that_makes_it_ready(
    database: Database,
):
    seeded = await _seed(database)
    async with database.transaction() as session:
        made = []
        for _ in range(2):
            made.append(
                await deployments.create_deployment(
                    session,
                    capability="cap",
                    artifact_set_id=seeded.artifact_set_id,
                    adapter={},
                    environment_id="",
                    replicas=1,
                    now=NOW,
                )
            )
        old, new = made
        await bindings.bind(
            session, capability="cap", deployment_id=old.deployment_id, serves_now=False, now=NOW
        )
        pending = await bindings.bind(
            session, capability="cap", deployment_id=new.deployment_id, serves_now=False, now=NOW
        )
        assert (pending.deployment_id, pending.pending_deployment_id) == (
            old.deployment_id,
            new.deployment_id,
        )
    # The new one loads: the binding waits. It becomes READY: the binding moves with it.
    async with database.transaction() as session:
        row = await deployments.get_deployment(session, new.deployment_id)
        await deployments.set_deployment_state(session, row, DeploymentState.LOADING, now=NOW)
        assert (await bindings.require_binding(session, "cap")).deployment_id == old.deployment_id
        await deployments.set_deployment_state(session, row, DeploymentState.READY, now=NOW)
        moved = await bindings.require_binding(session, "cap")
        assert (moved.deployment_id, moved.pending_deployment_id) == (new.deployment_id, None)
    # A pending deployment that fails stops being waited for; the bound one keeps the capability.
    async with database.transaction() as session:
        third = await deployments.create_deployment(
            session,
            capability="cap",
            artifact_set_id=seeded.artifact_set_id,
            adapter={},
            environment_id="",
            replicas=1,
            now=NOW,
        )
        await bindings.bind(
            session, capability="cap", deployment_id=third.deployment_id, serves_now=False, now=NOW
        )
        await deployments.set_deployment_state(session, third, DeploymentState.FAILED, now=NOW)
        kept = await bindings.require_binding(session, "cap")
        assert (kept.deployment_id, kept.pending_deployment_id) == (new.deployment_id, None)
        assert await bindings.bound_deployment_ids(
            session, [old.deployment_id, new.deployment_id, third.deployment_id]
        ) == {new.deployment_id}


# ---- with a real worker and a tiny real model -------------------------------------------------

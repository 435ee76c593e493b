"""When an artifact set or a node may be deleted, and what the refusal says."""

from __future__ import annotations

import grpc
import pytest

from gantry.controlplane.artifacts.deletion_rules import (
    SHOWN_IDS,
    artifact_set_delete_refusal,
    node_delete_refusal,
)
from gantry.controlplane.platform.state_machines import NodeState


def test_an_unused_artifact_set_may_be_deleted() -> None:
    assert artifact_set_delete_refusal("set-1", deployment_ids=[], open_job_ids=[]) is None


def test_an_artifact_set_in_use_names_a_few_deployments_and_counts_them_all() -> None:
    ids = [f"dep-{n}" for n in range(SHOWN_IDS + 2)]
    refusal = artifact_set_delete_refusal("set-1", deployment_ids=ids, open_job_ids=["job-1"])
    assert refusal is not None
    assert refusal.reason == "ARTIFACT_SET_IN_USE"
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    assert refusal.metadata["deployment_ids"] == ",".join(ids[:SHOWN_IDS])
    assert refusal.metadata["deployment_count"] == str(len(ids))
    assert "dep-0" in refusal.message and f"({len(ids)} in all)" in refusal.message
    assert ids[-1] not in refusal.message


def test_an_open_inspection_or_probe_keeps_an_artifact_set() -> None:
    refusal = artifact_set_delete_refusal("set-1", deployment_ids=[], open_job_ids=["job-1"])
    assert refusal is not None and refusal.reason == "ARTIFACT_SET_IN_USE"
    assert refusal.metadata == {"artifact_set_id": "set-1", "job_ids": "job-1", "job_count": "1"}


@pytest.mark.parametrize(
    ("state", "stream_open"),
    [
        (NodeState.CONNECTED, True),
        # Marked away while its stream is still being torn down: not yet.
        (NodeState.DISCONNECTED, True),
    ],
)
def test_a_node_that_may_take_work_is_refused_with_the_drain_command(
    state: NodeState, stream_open: bool
) -> None:
    refusal = node_delete_refusal(
        "node-1", state=state, stream_open=stream_open, warm_residency_ids=[], open_job_ids=[]
    )
    assert refusal is not None and refusal.reason == "NODE_IN_USE"
    assert "gantry nodes drain node-1" in refusal.message
    assert refusal.metadata["state"] == state


def test_a_drained_node_still_unloading_is_refused_naming_its_residencies() -> None:
    refusal = node_delete_refusal(
        "node-1",
        state=NodeState.DISABLED,
        stream_open=True,
        warm_residency_ids=["res-1"],
        open_job_ids=[],
    )
    assert refusal is not None and refusal.reason == "NODE_IN_USE"
    assert refusal.metadata["residency_ids"] == "res-1"
    assert refusal.metadata["residency_count"] == "1"


def test_a_node_with_an_open_job_is_refused() -> None:
    refusal = node_delete_refusal(
        "node-1",
        state=NodeState.DISCONNECTED,
        stream_open=False,
        warm_residency_ids=[],
        open_job_ids=["job-1", "job-2"],
    )
    assert refusal is not None and refusal.metadata["job_count"] == "2"


@pytest.mark.parametrize(
    ("state", "stream_open"),
    [
        (NodeState.DISABLED, True),  # drained; its worker is told it was deleted
        (NodeState.DISABLED, False),
        (NodeState.DISCONNECTED, False),
        (NodeState.REGISTERED, False),  # never connected: nothing ever ran there
    ],
)
def test_a_drained_away_or_never_connected_node_may_be_deleted(
    state: NodeState, stream_open: bool
) -> None:
    assert (
        node_delete_refusal(
            "node-1", state=state, stream_open=stream_open, warm_residency_ids=[], open_job_ids=[]
        )
        is None
    )

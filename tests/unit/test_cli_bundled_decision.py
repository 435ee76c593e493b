"""`gantry up`'s decision about the bundled model (pure): deploy it only on a first start; an
operator's unload or delete of it is their intent and is kept."""

from __future__ import annotations

import pytest

from gantry.cli import bootstrap
from gantry.v1 import control_plane_pb2


def _deployment(
    deployment_id: str,
    state: int,
    capability: str = "minilm",
) -> control_plane_pb2.Deployment:
    return control_plane_pb2.Deployment(
        deployment_id=deployment_id,
        capability=capability,
        state=state,  # type: ignore[arg-type]
        approval_id=f"appr-{deployment_id}",
    )


_D = control_plane_pb2


@pytest.mark.parametrize(
    ("existing", "decision", "chosen"),
    [
        ([], bootstrap.Bundled.DEPLOY, None),
        ([_deployment("o", _D.DEPLOYMENT_STATE_READY, "other")], bootstrap.Bundled.DEPLOY, None),
        ([_deployment("f", _D.DEPLOYMENT_STATE_FAILED)], bootstrap.Bundled.DEPLOY, None),
        ([_deployment("r", _D.DEPLOYMENT_STATE_READY)], bootstrap.Bundled.KEEP, "r"),
        ([_deployment("l", _D.DEPLOYMENT_STATE_LOADING)], bootstrap.Bundled.KEEP, "l"),
        ([_deployment("u", _D.DEPLOYMENT_STATE_UNLOADED)], bootstrap.Bundled.UNLOADED, "u"),
        ([_deployment("u", _D.DEPLOYMENT_STATE_UNLOADING)], bootstrap.Bundled.UNLOADED, "u"),
        (
            [
                _deployment("f", _D.DEPLOYMENT_STATE_FAILED),
                _deployment("u", _D.DEPLOYMENT_STATE_UNLOADED),
            ],
            bootstrap.Bundled.UNLOADED,
            "u",
        ),
        (
            [
                _deployment("u", _D.DEPLOYMENT_STATE_UNLOADED),
                _deployment("r", _D.DEPLOYMENT_STATE_READY),
            ],
            bootstrap.Bundled.KEEP,
            "r",
        ),
    ],
)
def test_the_bundled_model_is_deployed_only_on_a_first_start(
    existing: list[control_plane_pb2.Deployment], decision: bootstrap.Bundled, chosen: str | None
) -> None:
    made, deployment = bootstrap.decide_bundled(existing, "minilm")
    assert made is decision
    assert (deployment.deployment_id if deployment else None) == chosen


def _deleted(deployment_id: str, state: int) -> control_plane_pb2.Deployment:
    deployment = _deployment(deployment_id, state)
    deployment.deleted_at.FromSeconds(1_700_000_000)
    return deployment


@pytest.mark.parametrize("state", [_D.DEPLOYMENT_STATE_UNLOADED, _D.DEPLOYMENT_STATE_FAILED])
def test_a_deleted_bundled_deployment_is_the_operators_intent_and_not_deployed_again(
    state: int,
) -> None:
    made, deployment = bootstrap.decide_bundled([_deleted("d", state)], "minilm")
    assert made is bootstrap.Bundled.UNLOADED
    assert deployment is not None and deployment.deployment_id == "d"
    assert bootstrap.unloaded(deployment)  # `gantry up` does not wait for it to be READY
    assert bootstrap.stopped_by_operator(deployment) == "deleted"


def test_a_live_bundled_deployment_is_kept_beside_a_deleted_one() -> None:
    existing = [
        _deleted("d", _D.DEPLOYMENT_STATE_UNLOADED),
        _deployment("r", _D.DEPLOYMENT_STATE_READY),
    ]
    made, deployment = bootstrap.decide_bundled(existing, "minilm")
    assert made is bootstrap.Bundled.KEEP
    assert deployment is not None and deployment.deployment_id == "r"

"""The pure rules that keep an adopted endpoint accounted for: when the reconciler loads it again
(and where), how a reconnecting worker's adopted resident is compared with the record, and what
its failed pings mean for the residency."""

from __future__ import annotations

import dataclasses

import pytest

from gantry.controlplane.endpoints.reload_rules import AdoptedResidencyFacts, reload_wanted
from gantry.controlplane.nodes.inventory import reported_facts
from gantry.controlplane.nodes.inventory_rules import Action, RecordFacts, ReportedFacts, decide
from gantry.controlplane.platform.state_machines import DeploymentState as D
from gantry.controlplane.platform.state_machines import NodeState as N
from gantry.controlplane.platform.state_machines import ResidencyState as R
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg

GEN = 7
URL = "http://127.0.0.1:8080"

DUE = AdoptedResidencyFacts(
    deployment_state=D.PENDING,
    deployment_deleted=False,
    residency_state=R.COLD,
    node_state=N.CONNECTED,
    node_stream_open=True,
    open_job=False,
)


@pytest.mark.parametrize("state", [D.PENDING, D.LOADING, D.READY, D.DEGRADED])
def test_a_cold_endpoint_of_a_wanted_deployment_is_loaded_again_on_its_connected_node(
    state: D,
) -> None:
    assert reload_wanted(dataclasses.replace(DUE, deployment_state=state))


@pytest.mark.parametrize(
    "change",
    [
        {"deployment_state": D.UNLOADING},  # the operator unloaded it
        {"deployment_state": D.UNLOADED},
        {"deployment_state": D.FAILED},
        {"deployment_deleted": True},
        {"residency_state": R.LOADING},  # already on its way back
        {"residency_state": R.RESIDENT},
        {"residency_state": R.DRAINING},
        {"residency_state": R.UNCERTAIN},
        {"node_state": N.DISCONNECTED},  # its node's worker is away: nowhere else to go
        {"node_state": N.DISABLED},
        {"node_state": N.REGISTERED},
        {"node_stream_open": False},
        {"open_job": True},  # a LOAD or UNLOAD still open decides first
    ],
)
def test_nothing_is_loaded_otherwise(change: dict[str, object]) -> None:
    assert not reload_wanted(dataclasses.replace(DUE, **change))  # type: ignore[arg-type]


def _record(state: R = R.RESIDENT, *, endpoint_url: str = URL) -> RecordFacts:
    # What LoadHandler commits for an adopted endpoint: no artifact, no environment of ours.
    return RecordFacts(
        residency_id="r1",
        deployment_id="d1",
        state=state,
        generation=GEN,
        artifact_digest="",
        adapter_digest="b",
        environment_fingerprint="",
        load_in_flight=False,
        endpoint_url=endpoint_url,
    )


def _held(*, adopted: bool = True, url: str = URL, unresponsive: str = "") -> ReportedFacts:
    return ReportedFacts(
        deployment_id="d1",
        state=R.RESIDENT,
        pid=0,
        artifact_digest="" if adopted else "a",
        adapter_digest="b",
        environment_fingerprint="" if adopted else "c",
        restart_count=0,
        failure_reason="",
        failure_message="",
        crash_loop=False,
        adopted=adopted,
        endpoint_url=url if adopted else "",
        unresponsive=unresponsive,
    )


def _decided(record: RecordFacts, held: ReportedFacts) -> tuple[Action, str]:
    decisions, _ = decide([record], {"d1": held}, generation=GEN)
    return decisions[0].action, decisions[0].why


def test_a_reconnecting_worker_s_endpoint_at_the_recorded_url_is_adopted_as_is() -> None:
    assert _decided(_record(), _held()) == (Action.ADOPT, "")


def test_an_endpoint_at_another_url_is_uncertain_and_unloaded() -> None:
    action, why = _decided(_record(), _held(url="http://127.0.0.1:9999"))
    assert action is Action.UNCERTAIN and "endpoint url" in why


def test_a_model_host_where_an_endpoint_was_recorded_is_never_taken_for_it() -> None:
    action, why = _decided(_record(), _held(adopted=False))
    assert action is Action.UNCERTAIN and "kind" in why
    action, why = _decided(_record(endpoint_url=""), _held())
    assert action is Action.UNCERTAIN and "kind" in why


def test_an_endpoint_failing_its_pings_is_taken_out_of_routing_then_back() -> None:
    failing = _held(unresponsive="answered GET /v1/models with HTTP 503")
    assert _decided(_record(), failing) == (
        Action.UNRESPONSIVE,
        "answered GET /v1/models with HTTP 503",
    )
    # Already taken out: nothing more to do while it keeps failing.
    assert _decided(_record(R.LOADING), failing)[0] is Action.KEEP
    # It answers again: RESIDENT, as a host back from an in-place restart.
    assert _decided(_record(R.LOADING), _held())[0] is Action.RESIDENT


def _resident(*, adopted: bool, runtime: int) -> wg.ResidentModel:
    return wg.ResidentModel(
        deployment_id="d1",
        state=common_pb2.RESIDENCY_STATE_RESIDENT,
        adopted=adopted,
        endpoint_url=URL if adopted else "",
        health=wg.HealthReport(runtime=wg.HealthLayer(status=runtime, detail="HTTP 503")),
    )


def test_only_an_adopted_resident_s_failed_ping_reads_as_unresponsive() -> None:
    failed, ok = wg.HEALTH_STATUS_FAILED, wg.HEALTH_STATUS_OK
    assert reported_facts(_resident(adopted=True, runtime=failed)).unresponsive == "HTTP 503"
    assert not reported_facts(_resident(adopted=True, runtime=ok)).unresponsive
    # A model host's own supervision acts on its pings (kill, restart): shown as a restart.
    assert not reported_facts(_resident(adopted=False, runtime=failed)).unresponsive

"""What `gantry up` asks of the control plane, against an in-memory fake over real gRPC.

Run as a script (`python -m tests.integration.test_cli_bootstrap ROLE ARGS`) this module also
stands in for the three services, so test_cli_up can drive a whole `gantry up` before they exist.
"""

from __future__ import annotations

import argparse
import os
import signal
import stat
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from gantry.cli import bootstrap
from gantry.cli.errors import CliError
from gantry.cli.state import StatePaths
from gantry.v1 import (
    common_pb2,
    control_plane_pb2,
    control_plane_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    worker_gateway_pb2,
)
from tests.integration.polling import wait_until_sync

OPERATOR_TOKEN = "gop_test_secret"
FAKE_WORKER_STOP_ENV = "GANTRY_TEST_FAKE_WORKER_ON_SIGTERM"
CLIENT_KEY = "gak_key_secret"


class FakeControlPlane(control_plane_pb2_grpc.ControlPlaneServicer):
    """In-memory records; pages of at most `page_limit`; deployments READY after a few Gets."""

    def __init__(
        self,
        *,
        page_limit: int = 2,
        ready_after: int = 2,
        failure: common_pb2.Failure | None = None,
    ) -> None:
        self.lock = threading.Lock()
        self.page_limit = page_limit
        self.ready_after = ready_after
        self.failure = failure
        self.nodes: list[control_plane_pb2.Node] = []
        self.artifact_sets: list[control_plane_pb2.ArtifactSet] = []
        self.deployments: list[control_plane_pb2.Deployment] = []
        self.gets: dict[str, int] = {}
        self.calls: list[str] = []
        self.assessments: list[control_plane_pb2.CompatibilityAssessment] = []
        self.profiles: list[control_plane_pb2.RuntimeProfile] = []
        self.probes: list[control_plane_pb2.RuntimeProbe] = []
        self.candidates: dict[str, control_plane_pb2.DeploymentCandidate] = {}
        self.approvals: dict[str, control_plane_pb2.ProductionApproval] = {}
        self.candidate_status = control_plane_pb2.CANDIDATE_STATUS_LAB_READY

    def _authorize(self, context: grpc.ServicerContext, method: str) -> None:
        self.calls.append(method)
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {OPERATOR_TOKEN}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "operator token required")

    def _page(self, items: list[Any], request: Any) -> tuple[list[Any], str]:
        start = int(request.page_token or 0)
        end = start + min(request.page_size or 100, self.page_limit)
        return items[start:end], (str(end) if end < len(items) else "")

    def RegisterNode(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "RegisterNode")
        with self.lock:
            node = control_plane_pb2.Node(
                node_id=f"node-{len(self.nodes) + 1}",
                name=request.name,
                # The stand-in worker "connects" at once: there is no real stream here.
                state=common_pb2.NODE_STATE_CONNECTED,
            )
            self.nodes.append(node)
        return control_plane_pb2.RegisterNodeResponse(
            node=node, credential=f"gnc_{node.node_id}_secret"
        )

    def ListNodes(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "ListNodes")
        page, token = self._page(self.nodes, request)
        return control_plane_pb2.ListNodesResponse(nodes=page, next_page_token=token)

    def GetInventory(self, request: Any, context: grpc.ServicerContext) -> Any:
        """What a CPU worker's Hello says of its environments, as `make run` maps them: the
        default one ready, the vision one not built."""
        self._authorize(context, "GetInventory")
        return control_plane_pb2.NodeInventory(
            node_id=request.node_id,
            environments=[
                worker_gateway_pb2.RuntimeEnvironment(
                    environment_id="",
                    adapters=["sentence_transformers"],
                    device="cpu",
                    device_name="x86_64",
                    available=True,
                ),
                worker_gateway_pb2.RuntimeEnvironment(
                    environment_id="vision",
                    unavailable_reason="python executable '/x/.venv-vision/bin/python' for"
                    " environment 'vision' does not exist or is not executable: not built here;"
                    " `make vision-env` builds it",
                ),
            ],
        )

    def RegisterArtifactSet(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "RegisterArtifactSet")
        with self.lock:
            artifact_set = control_plane_pb2.ArtifactSet(
                artifact_set_id=f"as-{len(self.artifact_sets) + 1}",
                name=request.name,
                location=request.location,
                manifest_digest="d" * 64,
                file_count=len(request.manifest),
                total_size_bytes=sum(e.size_bytes for e in request.manifest),
            )
            self.artifact_sets.append(artifact_set)
        return artifact_set

    def ListArtifactSets(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "ListArtifactSets")
        page, token = self._page(self.artifact_sets, request)
        return control_plane_pb2.ListArtifactSetsResponse(artifact_sets=page, next_page_token=token)

    # The evidence pipeline's gates: each record advances one state per Get, as a real INSPECT or
    # PROBE job reports over time.
    def AssessCompatibility(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "AssessCompatibility")
        with self.lock:
            assessment = control_plane_pb2.CompatibilityAssessment(
                assessment_id=f"asm-{len(self.assessments) + 1}",
                artifact_set_id=request.artifact_set_id,
                node_id="node-1",
                state=control_plane_pb2.ASSESSMENT_STATE_PENDING,
            )
            self.assessments.append(assessment)
        return assessment

    def GetAssessment(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "GetAssessment")
        with self.lock:
            [assessment] = [a for a in self.assessments if a.assessment_id == request.assessment_id]
            assessment.state = control_plane_pb2.ASSESSMENT_STATE_COMPLETED
            assessment.compatible = True
            assessment.inspection.CopyFrom(
                worker_gateway_pb2.Inspection(
                    inspector="sentence_transformers",
                    task="embedding",
                    weight_format="safetensors",
                    adapters=["sentence_transformers"],
                    executable=True,
                )
            )
            return assessment

    def CreateRuntimeProfile(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "CreateRuntimeProfile")
        with self.lock:
            profile = control_plane_pb2.RuntimeProfile(
                profile_id=f"prof-{len(self.profiles) + 1}",
                name=request.name,
                assessment_id=request.assessment_id,
                adapter=request.adapter,
            )
            self.profiles.append(profile)
        return profile

    def StartProbe(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "StartProbe")
        with self.lock:
            probe = control_plane_pb2.RuntimeProbe(
                probe_id=f"probe-{len(self.probes) + 1}",
                profile_id=request.profile_id,
                node_id="node-1",
                state=common_pb2.PROBE_STATE_QUEUED,
            )
            self.probes.append(probe)
        return probe

    def GetProbe(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "GetProbe")
        with self.lock:
            [probe] = [p for p in self.probes if p.probe_id == request.probe_id]
            if probe.state == common_pb2.PROBE_STATE_QUEUED:
                probe.state = common_pb2.PROBE_STATE_LOADING
            else:
                probe.state = common_pb2.PROBE_STATE_COMPLETED
                probe.candidate_id = f"cand-{probe.probe_id}"
                self.candidates.setdefault(
                    probe.candidate_id,
                    control_plane_pb2.DeploymentCandidate(
                        candidate_id=probe.candidate_id,
                        probe_id=probe.probe_id,
                        profile_id=probe.profile_id,
                        status=self.candidate_status,
                        reasons=(
                            []
                            if self.candidate_status == control_plane_pb2.CANDIDATE_STATUS_LAB_READY
                            else ["model health layer FAILED"]
                        ),
                    ),
                )
            return probe

    def GetDeploymentCandidate(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "GetDeploymentCandidate")
        return self.candidates[request.candidate_id]

    def ApproveCandidate(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "ApproveCandidate")
        with self.lock:
            candidate = self.candidates[request.candidate_id]
            approval = control_plane_pb2.ProductionApproval(
                approval_id=f"appr-{candidate.candidate_id}",
                candidate_id=candidate.candidate_id,
                profile_id=candidate.profile_id,
                approved_by="operator",
                reason=request.reason,
            )
            self.approvals[approval.approval_id] = approval
        return approval

    def CreateDeployment(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "CreateDeployment")
        with self.lock:
            if request.approval_id not in self.approvals:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "NOT_APPROVED")
            approval = self.approvals[request.approval_id]
            [profile] = [p for p in self.profiles if p.profile_id == approval.profile_id]
            [assessment] = [a for a in self.assessments if a.assessment_id == profile.assessment_id]
            deployment = control_plane_pb2.Deployment(
                deployment_id=f"dep-{len(self.deployments) + 1}",
                capability=request.capability,
                artifact_set_id=assessment.artifact_set_id,
                adapter=profile.adapter,
                approval_id=approval.approval_id,
                profile_id=profile.profile_id,
                state=control_plane_pb2.DEPLOYMENT_STATE_PENDING,
            )
            self.deployments.append(deployment)
        return deployment

    def add_deployment(self, capability: str) -> control_plane_pb2.Deployment:
        """A deployment record as if created earlier (the tests of waiting need no gates)."""
        with self.lock:
            deployment = control_plane_pb2.Deployment(
                deployment_id=f"dep-{len(self.deployments) + 1}",
                capability=capability,
                state=control_plane_pb2.DEPLOYMENT_STATE_PENDING,
            )
            self.deployments.append(deployment)
        return deployment

    def GetDeployment(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "GetDeployment")
        with self.lock:
            deployment = next(
                (d for d in self.deployments if d.deployment_id == request.deployment_id), None
            )
            if deployment is None:
                context.abort(grpc.StatusCode.NOT_FOUND, "no such deployment")
            assert deployment is not None  # abort raised
            count = self.gets[deployment.deployment_id] = (
                self.gets.get(request.deployment_id, 0) + 1
            )
            if self.failure is not None and count >= self.ready_after:
                deployment.state = control_plane_pb2.DEPLOYMENT_STATE_FAILED
                deployment.last_failure.CopyFrom(self.failure)
            elif count >= self.ready_after:
                deployment.state = control_plane_pb2.DEPLOYMENT_STATE_READY
                if not deployment.residencies:
                    deployment.residencies.add(
                        node_id="node-1", state=common_pb2.RESIDENCY_STATE_RESIDENT, generation=7
                    )
                    # Serving now means: resident on the node's current, connected generation.
                    if not any(n.node_id == "node-1" for n in self.nodes):
                        self.nodes.append(control_plane_pb2.Node(node_id="node-1", name="n1"))
                    for node in self.nodes:
                        if node.node_id == "node-1":
                            node.state = common_pb2.NODE_STATE_CONNECTED
                            node.generation = 7
            else:
                deployment.state = control_plane_pb2.DEPLOYMENT_STATE_LOADING
            return deployment

    def ListDeployments(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "ListDeployments")
        # As the server does: deleted deployments only when asked for.
        listed = [
            d for d in self.deployments if request.include_deleted or not d.deleted_at.seconds
        ]
        page, token = self._page(listed, request)
        return control_plane_pb2.ListDeploymentsResponse(deployments=page, next_page_token=token)

    def UnloadDeployment(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "UnloadDeployment")
        for deployment in self.deployments:
            if deployment.deployment_id == request.deployment_id:
                deployment.state = control_plane_pb2.DEPLOYMENT_STATE_UNLOADING
                return deployment
        context.abort(grpc.StatusCode.NOT_FOUND, "no such deployment")

    def CreateApiKey(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "CreateApiKey")
        return control_plane_pb2.CreateApiKeyResponse(
            api_key_id="key-1", tenant_id=request.tenant_id, api_key=CLIENT_KEY
        )


class FakeInference(inference_pb2_grpc.InferenceServicer):
    def Embed(self, request: Any, context: grpc.ServicerContext) -> Any:
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {CLIENT_KEY}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "client key required")
        vectors = [
            inference_pb2.Vector(values=[0.1 * index, -0.5, 0.25, 1.0 / 3.0])
            for index, _ in enumerate(request.inputs)
        ]
        return inference_pb2.EmbedResponse(
            vectors=vectors, dim=4, deployment_id="dep-1", node_id="node-1"
        )


def serve(listen: str, *servicers: Any) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    for servicer in servicers:
        if isinstance(servicer, FakeControlPlane):
            control_plane_pb2_grpc.add_ControlPlaneServicer_to_server(servicer, server)
        elif isinstance(servicer, FakeInference):
            inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
    port = server.add_insecure_port(listen)
    server.start()
    return server, port


@dataclass
class FakeServer:
    control_plane: FakeControlPlane
    address: str
    stub: control_plane_pb2_grpc.ControlPlaneStub


@contextmanager
def running_fake() -> Iterator[FakeServer]:
    control_plane = FakeControlPlane()
    server, port = serve("127.0.0.1:0", control_plane, FakeInference())
    address = f"127.0.0.1:{port}"
    with grpc.insecure_channel(address) as channel:
        yield FakeServer(control_plane, address, control_plane_pb2_grpc.ControlPlaneStub(channel))
    server.stop(None)


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    with running_fake() as server:
        yield server


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "bundled"
    (directory / "1_Pooling").mkdir(parents=True)
    (directory / "config.json").write_text('{"model_type": "bert"}')
    (directory / "1_Pooling" / "config.json").write_text("{}")
    return directory


METADATA = (("authorization", f"Bearer {OPERATOR_TOKEN}"),)


def make_paths(tmp_path: Path) -> StatePaths:
    paths = StatePaths(tmp_path / "state")
    paths.create()
    return paths


def test_node_is_registered_once_and_its_credential_kept_private(
    fake: FakeServer, tmp_path: Path
) -> None:
    paths, said = make_paths(tmp_path), list[str]()
    bootstrap.ensure_node_credential(fake.stub, METADATA, paths, said.append)
    bootstrap.ensure_node_credential(fake.stub, METADATA, paths, said.append)
    assert fake.control_plane.calls.count("RegisterNode") == 1
    assert fake.control_plane.nodes[0].name.endswith("-local")
    assert paths.node_credential.read_text() == "gnc_node-1_secret\n"
    assert stat.S_IMODE(paths.node_credential.stat().st_mode) == 0o600


def test_the_bundled_model_is_placed_registered_and_deployed_once(
    fake: FakeServer, tmp_path: Path, model_dir: Path
) -> None:
    paths, said = make_paths(tmp_path), list[str]()
    first = bootstrap.ensure_deployment(fake.stub, METADATA, paths, model_dir, said.append)
    second = bootstrap.ensure_deployment(fake.stub, METADATA, paths, model_dir, said.append)
    assert first.deployment_id == second.deployment_id
    assert (paths.artifacts / "all-minilm-l6-v2" / "1_Pooling" / "config.json").exists()
    [artifact_set] = fake.control_plane.artifact_sets
    assert (artifact_set.name, artifact_set.location, artifact_set.file_count) == (
        "all-minilm-l6-v2",
        "all-minilm-l6-v2",
        2,
    )
    [deployment] = fake.control_plane.deployments
    assert deployment.capability == "minilm"
    assert deployment.adapter.adapter == "sentence_transformers"
    assert deployment.adapter.device == "cpu"
    # Every gate walked once, in order, and the deployment came from the approval.
    gates = [
        call
        for call in fake.control_plane.calls
        if call
        in (
            "AssessCompatibility",
            "CreateRuntimeProfile",
            "StartProbe",
            "ApproveCandidate",
            "CreateDeployment",
        )
    ]
    assert gates == [
        "AssessCompatibility",
        "CreateRuntimeProfile",
        "StartProbe",
        "ApproveCandidate",
        "CreateDeployment",
    ]
    assert deployment.approval_id == "appr-cand-probe-1"
    assert any("LAB_READY" in line for line in said)


def test_a_rejected_candidate_stops_the_walk_before_anything_is_approved(
    fake: FakeServer, tmp_path: Path, model_dir: Path
) -> None:
    fake.control_plane.candidate_status = control_plane_pb2.CANDIDATE_STATUS_REJECTED
    paths = make_paths(tmp_path)
    with pytest.raises(CliError, match="REJECTED: model health layer FAILED"):
        bootstrap.ensure_deployment(fake.stub, METADATA, paths, model_dir, lambda line: None)
    assert "ApproveCandidate" not in fake.control_plane.calls
    assert fake.control_plane.deployments == []


def test_a_failed_deployment_is_replaced_reusing_the_registered_artifact_set(
    fake: FakeServer, tmp_path: Path, model_dir: Path
) -> None:
    paths = make_paths(tmp_path)
    first = bootstrap.ensure_deployment(fake.stub, METADATA, paths, model_dir, lambda line: None)
    fake.control_plane.deployments[0].state = control_plane_pb2.DEPLOYMENT_STATE_FAILED
    second = bootstrap.ensure_deployment(fake.stub, METADATA, paths, model_dir, lambda line: None)
    assert second.deployment_id != first.deployment_id
    assert len(fake.control_plane.artifact_sets) == 1
    assert second.artifact_set_id == first.artifact_set_id


def test_the_bundled_decision_lists_deleted_deployments_too(
    fake: FakeServer, tmp_path: Path, model_dir: Path
) -> None:
    paths, said = make_paths(tmp_path), list[str]()
    first = bootstrap.ensure_deployment(fake.stub, METADATA, paths, model_dir, said.append)
    fake.control_plane.deployments[0].state = control_plane_pb2.DEPLOYMENT_STATE_UNLOADED
    fake.control_plane.deployments[0].deleted_at.FromSeconds(1_700_000_000)
    said.clear()
    again = bootstrap.ensure_deployment(fake.stub, METADATA, paths, model_dir, said.append)
    assert again.deployment_id == first.deployment_id
    assert fake.control_plane.calls.count("CreateDeployment") == 1
    assert said[0].startswith(f"minilm was deleted by the operator ({first.deployment_id})")


def test_an_unloaded_bundled_deployment_is_left_unloaded_and_says_how_to_redeploy(
    fake: FakeServer, tmp_path: Path, model_dir: Path
) -> None:
    paths, said = make_paths(tmp_path), list[str]()
    first = bootstrap.ensure_deployment(fake.stub, METADATA, paths, model_dir, said.append)
    fake.control_plane.deployments[0].state = control_plane_pb2.DEPLOYMENT_STATE_UNLOADED
    said.clear()
    again = bootstrap.ensure_deployment(fake.stub, METADATA, paths, model_dir, said.append)
    assert again.deployment_id == first.deployment_id and bootstrap.unloaded(again)
    assert len(fake.control_plane.deployments) == 1
    assert fake.control_plane.calls.count("CreateDeployment") == 1
    assert said == [
        f"minilm was unloaded by the operator ({first.deployment_id}); not deploying it again:"
        f" `gantry deploy {first.approval_id} --capability minilm` to bring it back"
    ]


def test_the_redeploy_hint_names_the_address_and_state_dir_up_was_given(
    fake: FakeServer, tmp_path: Path, model_dir: Path
) -> None:
    paths, said = make_paths(tmp_path), list[str]()
    first = bootstrap.ensure_deployment(fake.stub, METADATA, paths, model_dir, said.append)
    fake.control_plane.deployments[0].state = control_plane_pb2.DEPLOYMENT_STATE_UNLOADED
    said.clear()
    gantry = "gantry --address 127.0.0.1:6000 --state-dir other"
    bootstrap.ensure_deployment(fake.stub, METADATA, paths, model_dir, said.append, gantry=gantry)
    assert f"`{gantry} deploy {first.approval_id} --capability minilm`" in said[0]


def test_paging_follows_next_page_token_to_the_end(fake: FakeServer) -> None:
    for index in range(5):
        fake.control_plane.deployments.append(
            control_plane_pb2.Deployment(deployment_id=f"old-{index}", capability="other")
        )
    fake.control_plane.deployments.append(
        control_plane_pb2.Deployment(
            deployment_id="last",
            capability="minilm",
            state=control_plane_pb2.DEPLOYMENT_STATE_READY,
        )
    )
    found = bootstrap.find_live_deployment(fake.stub, METADATA, "minilm")
    assert found is not None and found.deployment_id == "last"
    assert fake.control_plane.calls.count("ListDeployments") == 3


def test_client_key_is_created_once_and_written_0600(fake: FakeServer, tmp_path: Path) -> None:
    paths = make_paths(tmp_path)
    bootstrap.ensure_client_key(fake.stub, METADATA, paths, lambda line: None)
    bootstrap.ensure_client_key(fake.stub, METADATA, paths, lambda line: None)
    assert fake.control_plane.calls.count("CreateApiKey") == 1
    assert paths.client_key.read_text() == f"{CLIENT_KEY}\n"
    assert stat.S_IMODE(paths.client_key.stat().st_mode) == 0o600


def test_waiting_reports_each_state_until_ready(fake: FakeServer, tmp_path: Path) -> None:
    fake.control_plane.ready_after = 3
    deployment = fake.control_plane.add_deployment("minilm")
    said: list[str] = []
    ready = bootstrap.wait_until_ready(
        fake.stub,
        METADATA,
        deployment.deployment_id,
        timeout_s=10,
        say=said.append,
        worker_log=tmp_path / "worker.log",
        interval_s=0.01,
    )
    assert ready.state == control_plane_pb2.DEPLOYMENT_STATE_READY
    assert said[0].endswith("LOADING (0s)")
    assert said[-1].startswith(f"deployment {deployment.deployment_id} is READY")


def test_a_failed_deployment_stops_the_wait_with_its_last_failure(
    fake: FakeServer, tmp_path: Path
) -> None:
    fake.control_plane.failure = common_pb2.Failure(
        reason="LOAD_FAILED", message="out of memory", failure_class=common_pb2.FAILURE_CLASS_INFRA
    )
    deployment = fake.control_plane.add_deployment("minilm")
    with pytest.raises(CliError, match=r"is FAILED \(LOAD_FAILED: out of memory\); see .*worker"):
        bootstrap.wait_until_ready(
            fake.stub,
            METADATA,
            deployment.deployment_id,
            timeout_s=10,
            say=lambda line: None,
            worker_log=tmp_path / "worker.log",
            interval_s=0.01,
        )


def _run_fake_role(role: str, argv: list[str]) -> int:
    """Stand-in services for test_cli_up: just enough of each one's command line and RPCs."""
    parser = argparse.ArgumentParser()
    for option in ("--listen", "--credential-file", "--bootstrap-operator-token-file"):
        parser.add_argument(option)
    options, _ = parser.parse_known_args(argv)
    # How the stand-in worker takes SIGTERM: "hold:PATH" stops only once PATH exists (a slow
    # stop), "ignore" never stops (a hung one).
    on_sigterm = os.environ.get(FAKE_WORKER_STOP_ENV, "") if role == "worker" else ""
    stop = threading.Event()
    if on_sigterm == "ignore":
        signal.signal(signal.SIGTERM, lambda *_: print("fake worker ignores SIGTERM", flush=True))
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = None
    if role == "scheduler":
        server, _ = serve(options.listen)
    elif role == "controlplane":
        global OPERATOR_TOKEN
        OPERATOR_TOKEN = Path(options.bootstrap_operator_token_file).read_text().strip()
        server, _ = serve(options.listen, FakeControlPlane(), FakeInference())
    elif not Path(options.credential_file).exists():
        print("worker: no credential", flush=True)
        return 1
    print(f"fake {role} running", flush=True)
    stop.wait()
    if on_sigterm.startswith("hold:"):
        print(f"fake {role} stopping, held", flush=True)
        release = Path(on_sigterm.removeprefix("hold:"))
        # A file the test creates: nothing to wait on but its presence. Never created, this
        # stand-in fails (its log says why) rather than stopping as if released.
        wait_until_sync(release.exists, 60, f"the test to release the held stop ({release})")
    if server is not None:
        server.stop(None)
    print(f"fake {role} stopped", flush=True)
    return 0


if __name__ == "__main__":
    from setproctitle import setproctitle

    setproctitle(f"gantry {sys.argv[1]}")
    sys.exit(_run_fake_role(sys.argv[1], sys.argv[2:]))


def test_deploying_waits_for_the_local_worker_to_connect(fake: FakeServer, tmp_path: Path) -> None:
    paths = StatePaths(tmp_path / "state")
    paths.create()
    bootstrap.ensure_node_credential(fake.stub, METADATA, paths, lambda _: None)
    fake.control_plane.nodes[0].state = common_pb2.NODE_STATE_REGISTERED
    with pytest.raises(CliError, match="did not connect"):
        bootstrap.wait_until_connected(
            fake.stub,
            METADATA,
            paths,
            timeout_s=0.2,
            say=lambda _: None,
            worker_log=tmp_path / "worker.log",
            interval_s=0.01,
        )
    fake.control_plane.nodes[0].state = common_pb2.NODE_STATE_CONNECTED
    said: list[str] = []
    bootstrap.wait_until_connected(
        fake.stub,
        METADATA,
        paths,
        timeout_s=5,
        say=said.append,
        worker_log=tmp_path / "worker.log",
        interval_s=0.01,
    )
    assert said and said[0].startswith("worker connected")

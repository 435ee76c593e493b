"""What `gantry up` asks of a fresh control plane: a node, the model deployed, a client key."""

from __future__ import annotations

import argparse
import enum
import functools
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from gantry.cli import pipeline
from gantry.cli.artifacts import hash_directory, place_copy
from gantry.cli.connection import Metadata, paged
from gantry.cli.errors import CliError
from gantry.cli.state import StatePaths, read_secret, write_secret
from gantry.cli.tables import enum_label
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc
from gantry.v1 import worker_gateway_pb2 as wg

MODEL_NAME = "all-minilm-l6-v2"
CAPABILITY = "minilm"
TIMEOUT_S = 30.0
# An assessment or a probe of the bundled model takes seconds; a cold disk or a loaded machine
# can stretch that, and each wait says what it is waiting for meanwhile.
GATE_TIMEOUT_S = 300.0
_GONE = (
    control_plane_pb2.DEPLOYMENT_STATE_FAILED,
    control_plane_pb2.DEPLOYMENT_STATE_UNLOADING,
    control_plane_pb2.DEPLOYMENT_STATE_UNLOADED,
)

_UNLOADED = (
    control_plane_pb2.DEPLOYMENT_STATE_UNLOADING,
    control_plane_pb2.DEPLOYMENT_STATE_UNLOADED,
)

Say = Callable[[str], None]
Stub = control_plane_pb2_grpc.ControlPlaneStub


def deployment_state(deployment: control_plane_pb2.Deployment) -> str:
    return enum_label(control_plane_pb2.DeploymentState.Name(deployment.state), "DEPLOYMENT_STATE_")


def ensure_node_credential(stub: Stub, metadata: Metadata, paths: StatePaths, say: Say) -> None:
    """Register this machine as a node once; the credential is shown once, so keep it (0600)."""
    if paths.node_credential.exists():
        return
    name = f"{socket.gethostname()}-local"
    response = stub.RegisterNode(
        control_plane_pb2.RegisterNodeRequest(name=name), metadata=metadata, timeout=TIMEOUT_S
    )
    write_secret(paths.node_credential, response.credential)
    say(f"registered node {name} ({response.node.node_id})")


def local_node_id(paths: StatePaths) -> str:
    """The node id `gantry up` registered, read from its credential (node_<id>_<secret>)."""
    return read_secret(paths.node_credential, what="node credential").split("_", 2)[1]


# `gantry up --device`: auto takes CUDA where the worker's default environment reports it.
DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"


def parse_device(text: str) -> str:
    """An argparse type for --device: auto, cpu, cuda or cuda:N (N a GPU index)."""
    name, colon, index = text.partition(":")
    if text in ("auto", "cpu", "cuda") or (name == "cuda" and colon and index.isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not one of {DEVICE_CHOICES}")


def choose_device(requested: str, default: wg.RuntimeEnvironment | None) -> str:
    """The torch device the bundled model is profiled on. Pure.

    auto: "cuda" when the worker's default environment reports CUDA, else "cpu". An explicit
    cuda[:N] on an environment without CUDA is refused, never quietly run on the CPU."""
    reported = default.device if default is not None and default.available else ""
    if requested == "auto":
        return "cuda" if reported == "cuda" else "cpu"
    if requested.startswith("cuda") and reported != "cuda":
        if default is None:
            seen = "was not reported"
        elif not reported:
            seen = "is not available"
        else:
            seen = f"reports device {reported!r}"
        raise CliError(
            f"--device {requested}: the worker's default environment {seen}, not CUDA;"
            " `--device cpu` (or auto) profiles the bundled model on the CPU"
        )
    return requested


def describe_environments(environments: Iterable[wg.RuntimeEnvironment]) -> list[str]:
    """One line per runtime environment the worker maps, for `gantry up`: what runs there, or
    why nothing does (the reason names the command that builds it, where the map says one)."""
    lines = []
    ordered = sorted(environments, key=lambda e: (e.environment_id != "", e.environment_id))
    for environment in ordered:
        name = environment.environment_id or "default"
        if environment.available:
            device = environment.device_name or environment.device or "cpu"
            adapters = ", ".join(environment.adapters) or "no adapters"
            lines.append(f"{name}: ready ({environment.device or 'cpu'}, {device}): {adapters}")
        else:
            lines.append(f"{name}: NOT AVAILABLE: {environment.unavailable_reason}")
    return lines


def runtime_environments(
    stub: Stub, metadata: Metadata, node_id: str
) -> list[wg.RuntimeEnvironment]:
    inventory = stub.GetInventory(
        control_plane_pb2.GetInventoryRequest(node_id=node_id), metadata=metadata, timeout=TIMEOUT_S
    )
    return list(inventory.environments)


def default_environment(
    environments: Iterable[wg.RuntimeEnvironment],
) -> wg.RuntimeEnvironment | None:
    return next((e for e in environments if e.environment_id in ("", "default")), None)


def wait_until_connected(
    stub: Stub,
    metadata: Metadata,
    paths: StatePaths,
    *,
    timeout_s: float,
    say: Say,
    worker_log: Path,
    interval_s: float = 0.2,
) -> None:
    """Wait for the local worker's stream: the scheduler places a deployment only on a node that
    is connected, so deploying before the worker dials in would be refused (NO_ELIGIBLE_NODE)."""
    node_id = local_node_id(paths)
    started = time.monotonic()
    while True:
        nodes = paged(
            stub.ListNodes,
            control_plane_pb2.ListNodesRequest,
            lambda response: response.nodes,
            metadata=metadata,
        )
        if any(n.node_id == node_id and n.state == common_pb2.NODE_STATE_CONNECTED for n in nodes):
            say(f"worker connected ({time.monotonic() - started:.1f}s)")
            return
        if time.monotonic() - started >= timeout_s:
            raise CliError(f"the worker did not connect within {timeout_s:g}s; see {worker_log}")
        time.sleep(interval_s)


def _deployments(
    stub: Stub, metadata: Metadata, *, include_deleted: bool = False
) -> Iterator[control_plane_pb2.Deployment]:
    return paged(
        stub.ListDeployments,
        functools.partial(
            control_plane_pb2.ListDeploymentsRequest, include_deleted=include_deleted
        ),
        lambda response: response.deployments,
        metadata=metadata,
    )


def find_live_deployment(
    stub: Stub, metadata: Metadata, capability: str
) -> control_plane_pb2.Deployment | None:
    """A deployment of the capability that is not failed or on its way out."""
    for deployment in _deployments(stub, metadata):
        if deployment.capability == capability and deployment.state not in _GONE:
            return deployment
    return None


def deleted(deployment: control_plane_pb2.Deployment) -> bool:
    return deployment.HasField("deleted_at")


def unloaded(deployment: control_plane_pb2.Deployment) -> bool:
    """Unloaded or on its way there, or deleted: only an operator's UnloadDeployment or
    DeleteDeployment leads to any of them."""
    return deployment.state in _UNLOADED or deleted(deployment)


def stopped_by_operator(deployment: control_plane_pb2.Deployment) -> str:
    """How `gantry up` names a bundled deployment the operator stopped."""
    return "deleted" if deleted(deployment) else deployment_state(deployment)


class Bundled(enum.Enum):
    """What `gantry up` does about the bundled model, given the deployments that exist."""

    DEPLOY = "deploy"  # never deployed (or every attempt failed): walk the gates
    KEEP = "keep"  # a live deployment: use it
    UNLOADED = "unloaded"  # the operator unloaded (or deleted) it on purpose: leave it so


def decide_bundled(
    deployments: Iterable[control_plane_pb2.Deployment], capability: str
) -> tuple[Bundled, control_plane_pb2.Deployment | None]:
    """Deploy the bundled model only on a first start: a live deployment is kept, and an unloaded
    one is the operator's intent (only an operator's UnloadDeployment leads there), so it is not
    undone at the next `gantry up`; so is a deleted one, whatever its state (`deployments` must
    include the deleted ones). A failed one is replaced: nobody chose that."""
    chosen = None
    for deployment in deployments:
        if deployment.capability != capability:
            continue
        if deployment.state not in _GONE and not deleted(deployment):
            return Bundled.KEEP, deployment
        if unloaded(deployment):
            chosen = deployment  # any one will do: each names an approval to deploy again
    if chosen is not None:
        return Bundled.UNLOADED, chosen
    return Bundled.DEPLOY, None


def ensure_artifact_set(
    stub: Stub, metadata: Metadata, paths: StatePaths, model_dir: Path, say: Say
) -> str:
    """The bundled model placed under the artifact root and registered; its artifact set id."""
    destination = paths.artifacts / MODEL_NAME
    if place_copy(model_dir, destination):
        say(f"placed the bundled model at {destination}")
    for artifact_set in paged(
        stub.ListArtifactSets,
        control_plane_pb2.ListArtifactSetsRequest,
        lambda response: response.artifact_sets,
        metadata=metadata,
    ):
        if artifact_set.name == MODEL_NAME and artifact_set.location == MODEL_NAME:
            return str(artifact_set.artifact_set_id)
    manifest = hash_directory(destination)
    registered = stub.RegisterArtifactSet(
        control_plane_pb2.RegisterArtifactSetRequest(
            name=MODEL_NAME, location=MODEL_NAME, manifest=manifest
        ),
        metadata=metadata,
        timeout=TIMEOUT_S,
    )
    say(
        f"registered artifact set {registered.artifact_set_id}"
        f" (digest {registered.manifest_digest[:16]}…, {len(manifest)} files)"
    )
    return str(registered.artifact_set_id)


def ensure_deployment(
    stub: Stub,
    metadata: Metadata,
    paths: StatePaths,
    model_dir: Path,
    say: Say,
    *,
    gate_timeout_s: float = GATE_TIMEOUT_S,
    gantry: str = "gantry",
    device: str = "cpu",
) -> control_plane_pb2.Deployment:
    """The bundled model deployed, through every gate of the evidence pipeline, for real:
    assessed on the local node, profiled, probed in a child that exits, approved, deployed.

    Only on a first start: a deployment the operator unloaded is returned as it is (UNLOADED),
    with a word on stderr on how to bring it back (`gantry`: the CLI as that hint spells it, with
    the address and state dir `gantry up` was given, so it works as pasted).
    """
    decision, existing = decide_bundled(
        _deployments(stub, metadata, include_deleted=True), CAPABILITY
    )
    if decision is not Bundled.DEPLOY and existing is not None:
        for line in existing_bundled_notes(decision, existing, gantry=gantry, device=device):
            say(line)
        return existing
    artifact_set_id = ensure_artifact_set(stub, metadata, paths, model_dir, say)
    profile = _assess_and_profile(
        stub, metadata, artifact_set_id, say, gate_timeout_s=gate_timeout_s, device=device
    )
    return _probe_approve_and_deploy(stub, metadata, profile, say, gate_timeout_s=gate_timeout_s)


def existing_bundled_notes(
    decision: Bundled, existing: control_plane_pb2.Deployment, *, gantry: str, device: str
) -> list[str]:
    """What `gantry up` says of a bundled deployment it keeps or leaves unloaded. Pure."""
    if decision is Bundled.KEEP:
        notes = [
            f"deployment {existing.deployment_id} ({CAPABILITY}) is {deployment_state(existing)}"
        ]
        if existing.adapter.device and existing.adapter.device != device:
            notes.append(
                f"it runs on {existing.adapter.device}, not {device}: `{gantry} unload"
                f" {existing.deployment_id}` and `{gantry} delete deployment"
                f" {existing.deployment_id}`, then `gantry up` profiles it on {device}"
            )
        return notes
    again = f"{gantry} deploy {existing.approval_id} --capability {CAPABILITY}"
    how = "deleted" if deleted(existing) else "unloaded"
    return [
        f"{CAPABILITY} was {how} by the operator ({existing.deployment_id});"
        f" not deploying it again: `{again}` to bring it back"
    ]


def _assess_and_profile(
    stub: Stub,
    metadata: Metadata,
    artifact_set_id: str,
    say: Say,
    *,
    gate_timeout_s: float,
    device: str,
) -> control_plane_pb2.RuntimeProfile:
    """The first gates: the artifact set assessed on the local node, then a profile for `device`."""
    assessment = pipeline.assess(
        stub, metadata, artifact_set_id=artifact_set_id, say=say, timeout_s=gate_timeout_s
    )
    pipeline.require_compatible(assessment)
    inspection = assessment.inspection
    say(
        f"assessed: {inspection.inspector} {inspection.task or inspection.model_type},"
        f" {inspection.weight_format} weights, adapters {', '.join(inspection.adapters)}"
    )
    profile: control_plane_pb2.RuntimeProfile = stub.CreateRuntimeProfile(
        control_plane_pb2.CreateRuntimeProfileRequest(
            assessment_id=assessment.assessment_id,
            name=f"{MODEL_NAME}-{device.replace(':', '')}",
            adapter=common_pb2.AdapterSettings(adapter="sentence_transformers", device=device),
        ),
        metadata=metadata,
        timeout=TIMEOUT_S,
    )
    say(f"created runtime profile {profile.profile_id} ({profile.name})")
    return profile


def _probe_approve_and_deploy(
    stub: Stub,
    metadata: Metadata,
    profile: control_plane_pb2.RuntimeProfile,
    say: Say,
    *,
    gate_timeout_s: float,
) -> control_plane_pb2.Deployment:
    """The last gates: the profile probed in a child that exits, approved, deployed."""
    probe = pipeline.run_probe(
        stub, metadata, profile_id=profile.profile_id, say=say, timeout_s=gate_timeout_s
    )
    candidate = pipeline.require_lab_ready(stub, metadata, probe)
    say(
        f"candidate {candidate.candidate_id} is LAB_READY"
        f" (evidence: gantry probe show {probe.probe_id})"
    )
    approval = stub.ApproveCandidate(
        control_plane_pb2.ApproveCandidateRequest(
            candidate_id=candidate.candidate_id,
            reason="gantry up: the bundled model passed its probe on this machine",
        ),
        metadata=metadata,
        timeout=TIMEOUT_S,
    )
    say(f"approved candidate {candidate.candidate_id} ({approval.approval_id})")
    deployment: control_plane_pb2.Deployment = stub.CreateDeployment(
        control_plane_pb2.CreateDeploymentRequest(
            approval_id=approval.approval_id, capability=CAPABILITY
        ),
        metadata=metadata,
        timeout=TIMEOUT_S,
    )
    say(f"created deployment {deployment.deployment_id} ({CAPABILITY})")
    return deployment


def ensure_client_key(stub: Stub, metadata: Metadata, paths: StatePaths, say: Say) -> None:
    if paths.client_key.exists():
        return
    response = stub.CreateApiKey(
        control_plane_pb2.CreateApiKeyRequest(tenant_id="default", name="local"),
        metadata=metadata,
        timeout=TIMEOUT_S,
    )
    write_secret(paths.client_key, response.api_key)
    say(f"created API key {response.api_key_id} for tenant {response.tenant_id}")


def wait_until_ready(
    stub: Stub,
    metadata: Metadata,
    deployment_id: str,
    *,
    timeout_s: float,
    say: Say,
    worker_log: Path,
    interval_s: float = 1.0,
    remind_every_s: float = 5.0,
) -> control_plane_pb2.Deployment:
    """Poll GetDeployment until READY, saying each state change and a reminder every few seconds."""
    started = time.monotonic()
    last_state: str | None = None
    last_said = started
    request = control_plane_pb2.GetDeploymentRequest(deployment_id=deployment_id)
    while True:
        deployment = stub.GetDeployment(request, metadata=metadata, timeout=TIMEOUT_S)
        state = deployment_state(deployment)
        now = time.monotonic()
        # READY means served now: the control plane degrades what it cannot see serving.
        if deployment.state == control_plane_pb2.DEPLOYMENT_STATE_READY:
            say(f"deployment {deployment_id} is READY ({now - started:.1f}s)")
            return deployment
        if deployment.state in _GONE:
            failure = deployment.last_failure
            why = (
                f"{failure.reason}: {failure.message}" if failure.reason else "no failure recorded"
            )
            raise CliError(f"deployment {deployment_id} is {state} ({why}); see {worker_log}")
        if state != last_state or now - last_said >= remind_every_s:
            say(f"waiting for deployment {deployment_id}: {state} ({now - started:.0f}s)")
            last_state, last_said = state, now
        if now - started >= timeout_s:
            raise CliError(
                f"deployment {deployment_id} is still {state} after {timeout_s:g}s;"
                f" see {worker_log}"
            )
        time.sleep(interval_s)

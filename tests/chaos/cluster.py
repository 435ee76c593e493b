"""A Gantry of real processes, as `gantry up` starts them, for fault injection with real signals.

Every service runs in its own process group with its log under the test's directory; the test
owns the groups and kills each one (and any model host of its deployments) in `stop`, so nothing
outlives it. Clients give every call a deadline and record how it ended in a `CallLedger`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gantry.common import tokens
from gantry.common.artifact_walk import build_manifest
from gantry.common.auth import auth_metadata
from gantry.common.ids import new_id
from gantry.common.status import error_info_of
from gantry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import control_plane_pb2_grpc as cp_grpc
from tests.fixtures.host_test_hooks import worker_argv
from tests.integration import polling
from tests.integration.harness import walk_the_gates
from tests.ports import free_port

CHILD_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}
HANG_INPUT = "__gantry_test_hook__:hang"
# Short intervals so faults are noticed in seconds (see `gantry controlplane --help`).
CONTROL_PLANE_ARGS = [
    "--heartbeat-interval-s", "0.5",
    "--reconcile-interval-s", "0.2",
    "--absence-grace-s", "5",
    "--lease-seconds", "5",
]  # fmt: skip
# A host that leaves a ping unanswered this long is killed as hung. Short, so a stopped host is
# found in seconds, but not so short that a loaded machine (two test workers, a fork server's
# imports taking 15 s) makes a healthy host miss it: a chaos test's host replaced unasked fails
# its "adopted exactly" checks. 0.5 s was the bound until then.
PING_TIMEOUT_S = 2.0
WORKER_ARGS = [
    "--ping-interval-s", "0.3",
    "--ping-timeout-s", str(PING_TIMEOUT_S),
    "--restart-initial-backoff-s", "0.2",
    "--crash-loop-threshold", "3",
    "--crash-loop-window-s", "60",
    "--crash-loop-backoff-s", "30",
]  # fmt: skip
# Reconnect quickly to a restarted control plane (gRPC's default backoff: 1 s, growing to 2 min).
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]
CALL_TIMEOUT_S = 5.0
# How long a model host orphaned by its worker's death may take to follow it (parent-death
# signal) before the test counts it as having outlived the test.
ORPHAN_EXIT_S = 5.0


def write_secret(path: Path, value: str) -> Path:
    path.write_text(value + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path


def model_host_pids(deployment_id: str) -> list[int]:
    """Live (not zombie) model host processes of one deployment, found by their process title."""
    title = f"gantry model-host {deployment_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if cmdline.split(b"\0")[0].startswith(title) and stat.rpartition(")")[2].split()[0] != "Z":
            found.append(int(entry.name))
    return found


def pids_in_groups(groups: set[int]) -> list[int]:
    """Live processes whose process group is one of `groups`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) in groups:
            found.append(int(entry.name))
    return found


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@dataclass
class Service:
    """One `gantry <role>` process in its own process group, logging to `log_path`."""

    role: str
    argv: list[str]
    log_path: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    groups: list[int] = field(default_factory=list)  # every group this service ever led

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start {self.role}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.groups.append(self.process.pid)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def send(self, signum: int) -> None:
        """Signal the service process itself (not its group: its children must fend for
        themselves, as after a real crash)."""
        assert self.process is not None
        os.kill(self.process.pid, signum)

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    async def wait_exit(self, timeout_s: float) -> int:
        assert self.process is not None
        await polling.wait_until(self.exited, timeout_s, f"{self.role} to exit")
        return self.process.returncode

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def kill_groups(self, grace_s: float) -> None:
        """SIGTERM every group this service led, then SIGKILL what is left after the grace."""
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.05,
    last: Callable[[], object] | None = None,
) -> float:
    """Poll state owned by other processes until it holds (the shared `polling.wait_until`);
    returns the seconds it took, which the chaos tests print."""
    started = time.monotonic()
    await polling.wait_until(condition, timeout_s, what, interval_s=interval_s, last=last)
    return time.monotonic() - started


@dataclass(frozen=True)
class CallOutcome:
    phase: str
    elapsed_s: float
    timeout_s: float
    code: grpc.StatusCode  # OK on success
    reason: str  # the ErrorInfo reason; "" on success or when the server attached none
    details: str = ""

    @property
    def ok(self) -> bool:
        return self.code == grpc.StatusCode.OK


@dataclass
class CallLedger:
    """Every client call of a test and how it ended."""

    outcomes: list[CallOutcome] = field(default_factory=list)

    def record(self, outcome: CallOutcome) -> CallOutcome:
        self.outcomes.append(outcome)
        return outcome

    def failures(self, phase: str | None = None) -> list[CallOutcome]:
        return [o for o in self.outcomes if not o.ok and (phase is None or o.phase == phase)]

    def assert_truthful(self, *, transport_failures_allowed: Sequence[str] = ()) -> None:
        """Each call succeeded or failed typed (an ErrorInfo reason), so none was held until its
        deadline: that ends a call DEADLINE_EXCEEDED with no reason, which counts as untyped.

        A phase in `transport_failures_allowed` had no server listening (the control plane was
        dead), so an UNAVAILABLE without a reason is the only honest answer there.
        """
        untyped = [
            o
            for o in self.outcomes
            if not o.ok
            and not o.reason
            and not (
                o.phase in transport_failures_allowed and o.code == grpc.StatusCode.UNAVAILABLE
            )
        ]
        assert not untyped, f"calls failed without a typed reason: {untyped}"


@dataclass
class Cluster:
    """Scheduler, control plane and one worker as separate processes on one PostgreSQL database."""

    database_url: str
    root: Path
    ledger: CallLedger = field(default_factory=CallLedger)
    scheduler: Service | None = None
    control_plane: Service | None = None
    worker: Service | None = None
    channel: grpc.aio.Channel | None = None
    operator_token: str = ""
    api_key: str = ""
    node_id: str = ""
    deployment_ids: list[str] = field(default_factory=list)
    scheduler_port: int = 0
    control_plane_port: int = 0
    # Schedulers after the first in the control plane's --scheduler list (one active at a time).
    standby_schedulers: int = 0
    standbys: list[Service] = field(default_factory=list)
    standby_ports: list[int] = field(default_factory=list)
    # Control-plane replicas on the one database (all given every scheduler; the worker holds a
    # stream to each): the first is `control_plane`, the others `replicas`.
    control_planes: int = 1
    replicas: list[Service] = field(default_factory=list)
    replica_ports: list[int] = field(default_factory=list)
    metrics_ports: dict[str, int] = field(default_factory=dict)  # replica role -> /metrics port
    _replica_channels: dict[int, grpc.aio.Channel] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.artifact_root = self.root / "artifacts"
        self.artifact_root.mkdir(parents=True, exist_ok=True)
        self.logs = self.root / "logs"
        self.logs.mkdir(exist_ok=True)
        self.env = {**os.environ, **CHILD_ENV}
        self.scheduler_token_file = write_secret(
            self.root / "scheduler.token", tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler")
        )
        self.operator_token = tokens.mint_token(tokens.OPERATOR_TOKEN, new_id())
        self.operator_token_file = write_secret(self.root / "operator.token", self.operator_token)
        self.credential_file = self.root / "node.credential"

    # -- processes -------------------------------------------------------------------------

    def _service(self, role: str, arguments: list[str], *, name: str = "") -> Service:
        argv = [sys.executable, "-m", "gantry.cli.main", role, *arguments]
        if role == "worker":
            # The same `gantry worker`, its model hosts taking the magic inputs (HANG_INPUT):
            # only a test entry point switches them on, never a worker's environment.
            argv = worker_argv(*arguments)
        log_path = self.logs / f"{name or role}.log"
        return Service(role=name or role, argv=argv, log_path=log_path, env=self.env)

    def _scheduler(self, port: int, name: str = "") -> Service:
        arguments = ["--listen", f"127.0.0.1:{port}"]
        arguments += ["--service-token-file", str(self.scheduler_token_file)]
        return self._service("scheduler", arguments, name=name)

    def _control_plane(self, port: int, schedulers: str, name: str = "") -> Service:
        metrics: list[str] = []
        if self.control_planes > 1:  # which replica answered what (a lone one needs no scrape)
            metrics_port = self.metrics_ports[name or "controlplane"] = free_port()
            metrics = ["--metrics-address", f"127.0.0.1:{metrics_port}"]
        return self._service(
            "controlplane",
            [
                "--listen", f"127.0.0.1:{port}",
                "--database-url", self.database_url,
                "--scheduler", schedulers,
                "--scheduler-token-file", str(self.scheduler_token_file),
                "--bootstrap-operator-token-file", str(self.operator_token_file),
                *metrics,
                *CONTROL_PLANE_ARGS,
            ],
            name=name,
        )  # fmt: skip

    @property
    def control_plane_addresses(self) -> list[str]:
        """Every replica's address, the first one's first."""
        return [f"127.0.0.1:{p}" for p in [self.control_plane_port, *self.replica_ports]]

    async def migrate(self) -> None:
        process = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "gantry.cli.main", "migrate"],
            *["--database-url", self.database_url],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode == 0, f"gantry migrate failed: {stderr.decode()}"

    async def start(self) -> None:
        """Migrate, start the scheduler and the control plane, register this node, start the
        worker and wait until the node is CONNECTED."""
        await self.migrate()
        self.scheduler_port = free_port()
        self.control_plane_port = free_port()
        self.scheduler = self._scheduler(self.scheduler_port)
        self.standby_ports = [free_port() for _ in range(self.standby_schedulers)]
        self.standbys = [
            self._scheduler(port, f"scheduler-{n}") for n, port in enumerate(self.standby_ports, 2)
        ]
        schedulers = ",".join(f"127.0.0.1:{p}" for p in [self.scheduler_port, *self.standby_ports])
        self.control_plane = self._control_plane(self.control_plane_port, schedulers)
        self.replica_ports = [free_port() for _ in range(self.control_planes - 1)]
        self.replicas = [
            self._control_plane(port, schedulers, f"controlplane-{n}")
            for n, port in enumerate(self.replica_ports, 2)
        ]
        self.worker = self._service(
            "worker",
            [
                "--control-plane", ",".join(self.control_plane_addresses),
                "--credential-file", str(self.credential_file),
                "--artifact-root", str(self.artifact_root),
                *WORKER_ARGS,
            ],
        )  # fmt: skip
        for scheduler in (self.scheduler, *self.standbys):
            scheduler.start()
        self.control_plane.start()
        await self.wait_serving(self.scheduler, self.scheduler_port)
        for standby, port in zip(self.standbys, self.standby_ports, strict=True):
            await self.wait_serving(standby, port)
        await self.wait_serving(self.control_plane, self.control_plane_port)
        # One by one, as `gantry up` starts them: the first has bootstrapped the operator token.
        for replica, port in zip(self.replicas, self.replica_ports, strict=True):
            replica.start()
            await self.wait_serving(replica, port)
        self.use_replica(self.control_plane_port)
        registered = await self.operator.RegisterNode(
            cp.RegisterNodeRequest(name="chaos-node"), metadata=self.op_md, timeout=10
        )
        self.node_id = registered.node.node_id
        write_secret(self.credential_file, registered.credential)
        key = await self.operator.CreateApiKey(
            cp.CreateApiKeyRequest(tenant_id="chaos", name="chaos"), metadata=self.op_md, timeout=10
        )
        self.api_key = key.api_key
        self.worker.start()
        await self.wait_node_state(common_pb2.NODE_STATE_CONNECTED, timeout_s=30)

    async def wait_serving(self, service: Service, port: int, timeout_s: float = 30) -> float:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            async def serving() -> bool:
                assert not service.exited(), f"{service.role} exited:\n{service.log_tail()}"
                try:
                    answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                except grpc.RpcError:
                    return False
                return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

            return await wait_until(serving, timeout_s=timeout_s, what=f"{service.role} SERVING")

    def services(self) -> list[Service]:
        services = (self.worker, self.control_plane, *self.replicas, self.scheduler, *self.standbys)
        return [s for s in services if s is not None]

    async def stop(self) -> None:
        """Kill every process group this test started and every model host of its deployments."""
        for channel in self._replica_channels.values():
            await channel.close()
        for service in self.services():
            if service.process is not None and not service.exited():
                service.send(signal.SIGCONT)  # a stopped one would not act on SIGTERM
        for service in self.services():
            service.kill_groups(grace_s=3.0)
        # A model host whose worker died was re-parented out of the worker's group; it dies by
        # its parent-death signal, but nothing of this test may outlive it, so make sure.
        groups = {group for service in self.services() for group in service.groups}

        def left_running() -> list[int]:
            found = [pid for d in self.deployment_ids for pid in model_host_pids(d)]
            return found + [pid for pid in pids_in_groups(groups) if pid not in found]

        with contextlib.suppress(pytest.fail.Exception):  # what is still running is named below
            await wait_until(
                lambda: not left_running(),
                timeout_s=ORPHAN_EXIT_S,
                what="every process of the test to exit",
            )
        leftovers = left_running()
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert not leftovers, f"processes outlived the test: {leftovers}"

    def print_logs_on_failure(self) -> None:
        for service in self.services():
            print(f"----- {service.role} log tail -----\n{service.log_tail(60)}")

    # -- gRPC ------------------------------------------------------------------------------

    def use_replica(self, port: int) -> None:
        """Make every later RPC of the cluster's own (operator calls, `embed`) go to the replica
        on `port` only: one the test knows to be alive while it stops another."""
        if port not in self._replica_channels:
            self._replica_channels[port] = grpc.aio.insecure_channel(
                f"127.0.0.1:{port}", options=CHANNEL_OPTIONS
            )
        self.channel = self._replica_channels[port]

    @property
    def operator(self) -> cp_grpc.ControlPlaneStub:
        assert self.channel is not None
        return cp_grpc.ControlPlaneStub(self.channel)

    @property
    def inference(self) -> inference_pb2_grpc.InferenceStub:
        assert self.channel is not None
        return inference_pb2_grpc.InferenceStub(self.channel)

    @property
    def op_md(self) -> tuple[tuple[str, str], ...]:
        return auth_metadata(self.operator_token)

    async def register_and_deploy(
        self, source: Path, capability: str, *, max_batch_size: int = 0
    ) -> str:
        """The model at `source` through every gate as `capability` (a batch size of 0: the
        adapter's default)."""
        target = self.artifact_root / capability
        if not target.exists():
            shutil.copytree(source, target)
        artifact = await self.operator.RegisterArtifactSet(
            cp.RegisterArtifactSetRequest(
                name=capability,
                location=capability,
                manifest=[
                    common_pb2.ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256)
                    for e in build_manifest(target)
                ],
            ),
            metadata=self.op_md,
            timeout=10,
        )
        deployment = await walk_the_gates(
            self.operator,
            self.op_md,
            artifact_set_id=artifact.artifact_set_id,
            capability=capability,
            adapter=common_pb2.AdapterSettings(
                adapter="sentence_transformers", device="cpu", max_batch_size=max_batch_size
            ),
        )
        self.deployment_ids.append(deployment.deployment_id)
        return deployment.deployment_id

    async def deployment(self, deployment_id: str) -> cp.Deployment:
        return await self.operator.GetDeployment(
            cp.GetDeploymentRequest(deployment_id=deployment_id), metadata=self.op_md, timeout=5
        )

    async def node(self) -> cp.Node:
        return await self.operator.GetNode(
            cp.GetNodeRequest(node_id=self.node_id), metadata=self.op_md, timeout=5
        )

    async def wait_deployment(
        self,
        deployment_id: str,
        check: Callable[[cp.Deployment], bool],
        *,
        timeout_s: float,
        what: str,
    ) -> cp.Deployment:
        latest: list[cp.Deployment] = []

        async def reached() -> bool:
            try:
                latest[:] = [await self.deployment(deployment_id)]
            except grpc.RpcError:
                return False  # the control plane may be restarting
            return check(latest[0])

        await wait_until(reached, timeout_s=timeout_s, what=what, last=lambda: latest)
        return latest[0]

    async def wait_ready(self, deployment_id: str, *, timeout_s: float = 60) -> cp.Deployment:
        return await self.wait_deployment(
            deployment_id,
            lambda d: (
                d.state == cp.DEPLOYMENT_STATE_READY
                and any(
                    r.pid for r in d.residencies if r.state == common_pb2.RESIDENCY_STATE_RESIDENT
                )
            ),
            timeout_s=timeout_s,
            what=f"deployment {deployment_id} READY with a resident host",
        )

    async def wait_node_state(self, state: int, *, timeout_s: float) -> float:
        async def reached() -> bool:
            try:
                return (await self.node()).state == state
            except grpc.RpcError:
                return False

        return await wait_until(reached, timeout_s=timeout_s, what=f"node state {state}")

    async def embed(
        self,
        capability: str,
        *,
        phase: str,
        inputs: Sequence[str] = ("hello world",),
        timeout_s: float = CALL_TIMEOUT_S,
        stub: inference_pb2_grpc.InferenceStub | None = None,
    ) -> CallOutcome:
        """One Embed recorded in the ledger: on the cluster's channel, or on `stub`'s (a client
        of its own)."""
        started = time.monotonic()
        try:
            response = await (stub or self.inference).Embed(
                inference_pb2.EmbedRequest(capability=capability, inputs=list(inputs)),
                metadata=auth_metadata(self.api_key),
                timeout=timeout_s,
            )
        except grpc.aio.AioRpcError as error:
            info = error_info_of(error)
            return self.ledger.record(
                CallOutcome(
                    phase=phase,
                    elapsed_s=time.monotonic() - started,
                    timeout_s=timeout_s,
                    code=error.code(),
                    reason=info.reason if info is not None else "",
                    details=error.details() or "",
                )
            )
        assert len(response.vectors) == len(inputs) and response.dim == 32
        return self.ledger.record(
            CallOutcome(
                phase=phase,
                elapsed_s=time.monotonic() - started,
                timeout_s=timeout_s,
                code=grpc.StatusCode.OK,
                reason="",
            )
        )

    async def wait_serving_again(
        self, capability: str, *, phase: str, timeout_s: float, since: float
    ) -> float:
        """Call until one succeeds (each call typed or ok); seconds from `since` to the success."""

        async def served() -> bool:
            return (await self.embed(capability, phase=phase, timeout_s=3.0)).ok

        await wait_until(
            served,
            timeout_s=timeout_s,
            what=f"{capability} serving again",
            interval_s=0.1,  # between a failed call and the next
            last=lambda: self.ledger.outcomes[-1],
        )
        return time.monotonic() - since

    async def invariants(self) -> cp.InvariantReport:
        return await self.operator.CheckInvariants(
            cp.CheckInvariantsRequest(), metadata=self.op_md, timeout=5
        )

    async def wait_invariants_hold(self, *, timeout_s: float = 20) -> None:
        report: list[cp.InvariantReport] = []

        async def hold() -> bool:
            try:
                report[:] = [await self.invariants()]
            except grpc.RpcError:
                return False
            return report[0].all_hold

        def broken() -> object:
            if not report:
                return "no report"
            return {i.name: list(i.offending_ids) for i in report[0].invariants if not i.holds}

        await wait_until(hold, timeout_s=timeout_s, what="all invariants hold", last=broken)

    async def audit_actions(self, subject_id: str) -> list[str]:
        """The audit trail of one subject, read straight from the database (no RPC lists it)."""
        import asyncpg

        dsn = self.database_url.replace("postgresql+asyncpg://", "postgresql://")
        connection = await asyncpg.connect(dsn, timeout=5)
        try:
            rows = await connection.fetch(
                "SELECT action FROM audit_events WHERE subject_id = $1 ORDER BY event_id",
                subject_id,
            )
        finally:
            await connection.close()
        return [row["action"] for row in rows]

    async def jobs(self, deployment_id: str) -> list[cp.ServingJob]:
        listed = await self.operator.ListServingJobs(
            cp.ListServingJobsRequest(deployment_id=deployment_id, page_size=1000),
            metadata=self.op_md,
            timeout=5,
        )
        return list(listed.jobs)

    async def assert_current_generation_owns_everything(self) -> None:
        """No process of a dead generation holds a residency or a lease."""
        generation = (await self.node()).generation
        for deployment_id in self.deployment_ids:
            deployment = await self.deployment(deployment_id)
            for residency in deployment.residencies:
                if residency.state in (
                    common_pb2.RESIDENCY_STATE_RESIDENT,
                    common_pb2.RESIDENCY_STATE_LOADING,
                ):
                    assert residency.generation == generation, (
                        f"residency {residency.residency_id} held by generation "
                        f"{residency.generation}, the node is at {generation}"
                    )
            for job in await self.jobs(deployment_id):
                if job.state in (cp.SERVING_JOB_STATE_LEASED, cp.SERVING_JOB_STATE_RUNNING):
                    assert job.generation == generation, f"{job} leased by a dead generation"


def resident_pid(deployment: cp.Deployment) -> int:
    pids = [
        r.pid
        for r in deployment.residencies
        if r.state == common_pb2.RESIDENCY_STATE_RESIDENT and r.pid
    ]
    assert len(pids) == 1, f"expected one resident host: {deployment}"
    return pids[0]

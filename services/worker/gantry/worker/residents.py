"""The worker's bounded map deployment id -> resident, and the inventory it reports.

A resident is in the map from the moment its load is admitted until its child is reaped and its
reclaim verified: custody never ends on a hope. The map itself holds no policy; supervision moves
residents between states.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, Unpack

from google.protobuf import timestamp_pb2
from google.protobuf.message import Message

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2, model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.crash_policy import CrashHistory
from gantry.worker.model_host.host_calls import InvokeOptions
from gantry.worker.model_host.process import HostLaunchSpec, OnExit

DEFAULT_MAX_RESIDENTS = 8

LOADING = common_pb2.RESIDENCY_STATE_LOADING
RESIDENT = common_pb2.RESIDENCY_STATE_RESIDENT
UNLOADING = common_pb2.RESIDENCY_STATE_UNLOADING
UNCERTAIN = common_pb2.RESIDENCY_STATE_UNCERTAIN


class SupervisedHost(Protocol):
    """What supervision needs of a model host (`ModelHost`; tests may pass a named fake)."""

    @property
    def pid(self) -> int: ...

    @property
    def alive(self) -> bool: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def unresponsive(self) -> GantryError | None: ...

    @property
    def ready(self) -> model_host_pb2.HostReady: ...

    async def invoke(
        self, kind: str, payload: Message, **options: Unpack[InvokeOptions]
    ) -> Message:
        """Run one inference operation's payload (`kind`: its field in Invoke, from the
        registry, gantry.common.operations) and return its result (the message of the
        operation's `result_kind`); a kind this host does not serve is INVALID_PAYLOAD. A
        streamed generation's deltas go to `on_delta`, in order, before the result."""
        ...

    async def ping(self, *, timeout_s: float) -> model_host_pb2.Pong: ...

    async def check_model(self, *, timeout_s: float) -> wg.HealthReport: ...

    async def stop(self, *, grace_s: float = ...) -> wg.UnloadEvidence: ...

    async def terminate(self, *, grace_s: float, reap_s: float = ...) -> wg.UnloadEvidence:
        """The worker's own stop: SIGTERM now, SIGKILL after `grace_s`, reaped within `reap_s`
        more (no Shutdown asked, nothing released first: the exit releases it all)."""
        ...

    def kill_unresponsive(self, why: str) -> None: ...

    def rss_bytes(self) -> int: ...


class HostFactory(Protocol):
    async def __call__(
        self, spec: HostLaunchSpec, *, on_exit: OnExit | None = ..., trace_context: dict[str, str]
    ) -> SupervisedHost: ...


@dataclass(frozen=True, kw_only=True)
class ResidentFacts:
    """What exact adoption compares: fixed when the load is admitted, unchanged by restarts."""

    artifact_digest: str
    environment_id: str
    adapter_digest: str
    environment_fingerprint: str


@dataclass(eq=False, kw_only=True)
class Resident:
    deployment_id: str
    facts: ResidentFacts
    crashes: CrashHistory
    state: common_pb2.ResidencyState = LOADING
    # Set once the artifact is verified; restarts reuse it (same directory, adapter, interpreter).
    launch: HostLaunchSpec | None = None
    host: SupervisedHost | None = None
    restart_count: int = 0
    last_failure: common_pb2.Failure | None = None
    crash_loop: bool = False
    next_restart_at: dt.datetime | None = None
    health: wg.HealthReport | None = None
    # The initial load, or a restart backing off and starting: what an unload cancels.
    start_task: asyncio.Task[SupervisedHost | None] | None = None
    # The cgroup's OOM-kill counter when the current host started (None: unreadable).
    oom_kills_at_start: int | None = None
    # An adopted external server (adopted_endpoint.py): no process of ours, never restarted.
    adopted: bool = False
    endpoint_url: str = ""

    def to_proto(self) -> wg.ResidentModel:
        host = self.host
        resident = wg.ResidentModel(
            deployment_id=self.deployment_id,
            artifact_digest=self.facts.artifact_digest,
            environment_id=self.facts.environment_id,
            adapter_digest=self.facts.adapter_digest,
            environment_fingerprint=self.facts.environment_fingerprint,
            state=self.state,
            # The pid of a host we still hold custody of, even when UNCERTAIN: that is its point.
            pid=host.pid if host is not None else 0,
            rss_bytes=host.rss_bytes() if host is not None else 0,
            restart_count=self.restart_count,
            crash_loop=self.crash_loop,
            adopted=self.adopted,
            endpoint_url=self.endpoint_url,
        )
        if self.last_failure is not None:
            resident.last_failure.CopyFrom(self.last_failure)
        if self.next_restart_at is not None:
            resident.next_restart_at.CopyFrom(_timestamp(self.next_restart_at))
        if self.health is not None:
            resident.health.CopyFrom(self.health)
        if host is not None:
            # The current host's sandbox: each restart enters its own and may report another.
            resident.isolation = host.ready.isolation
            resident.isolation_reason = host.ready.isolation_reason
        return resident


class ResidentMap:
    """Load, unload and invoke touch one exact deployment; nothing here clears another resident."""

    def __init__(self, *, max_residents: int = DEFAULT_MAX_RESIDENTS) -> None:
        self._max = max_residents
        self._residents: dict[str, Resident] = {}

    def admit(self, resident: Resident) -> None:
        """Claim a slot before a load starts, so two loads cannot overfill the map."""
        if resident.deployment_id in self._residents:
            raise GantryError(
                "INVALID_STATE_TRANSITION",
                f"deployment {resident.deployment_id} is already on this worker",
            )
        if len(self._residents) >= self._max:
            raise GantryError(
                "NO_CAPACITY", f"this worker holds its maximum of {self._max} model hosts"
            )
        self._residents[resident.deployment_id] = resident

    def get(self, deployment_id: str) -> Resident | None:
        return self._residents.get(deployment_id)

    def remove(self, resident: Resident) -> bool:
        """End custody of exactly this resident (never a newer one under the same id)."""
        if self._residents.get(resident.deployment_id) is resident:
            del self._residents[resident.deployment_id]
            return True
        return False

    def __iter__(self) -> Iterator[Resident]:
        return iter(list(self._residents.values()))

    def __len__(self) -> int:
        return len(self._residents)

    def inventory(self, generation: int) -> wg.Inventory:
        return wg.Inventory(
            generation=generation, residents=[r.to_proto() for r in self._residents.values()]
        )


def _timestamp(value: dt.datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(value)
    return stamp

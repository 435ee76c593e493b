"""The worker's bounded map deployment id -> model host, and the inventory it reports."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.model_host.process import ModelHost

DEFAULT_MAX_RESIDENTS = 8


@dataclass(eq=False, kw_only=True)
class Resident:
    deployment_id: str
    artifact_digest: str
    environment_id: str
    host: ModelHost


class ResidentMap:
    """Load, unload and invoke touch one exact deployment; nothing here clears another resident."""

    def __init__(self, *, max_residents: int = DEFAULT_MAX_RESIDENTS) -> None:
        self._max = max_residents
        self._residents: dict[str, Resident] = {}
        self._reserved: set[str] = set()

    def reserve(self, deployment_id: str) -> None:
        """Claim a slot before a load starts, so two loads cannot overfill the map."""
        if deployment_id in self._residents or deployment_id in self._reserved:
            raise GantryError(
                "INVALID_STATE_TRANSITION", f"deployment {deployment_id} is already on this worker"
            )
        if len(self._residents) + len(self._reserved) >= self._max:
            raise GantryError(
                "NO_CAPACITY", f"this worker holds its maximum of {self._max} model hosts"
            )
        self._reserved.add(deployment_id)

    def release(self, deployment_id: str) -> None:
        self._reserved.discard(deployment_id)

    def add(self, resident: Resident) -> None:
        self._reserved.discard(resident.deployment_id)
        self._residents[resident.deployment_id] = resident

    def get(self, deployment_id: str) -> Resident | None:
        return self._residents.get(deployment_id)

    def pop(self, deployment_id: str) -> Resident | None:
        return self._residents.pop(deployment_id, None)

    def discard_host(self, host: ModelHost) -> bool:
        resident = self._residents.get(host.deployment_id)
        if resident is not None and resident.host is host:
            del self._residents[host.deployment_id]
            return True
        return False

    def __iter__(self) -> Iterator[Resident]:
        return iter(list(self._residents.values()))

    def __len__(self) -> int:
        return len(self._residents)

    def inventory(self, generation: int) -> wg.Inventory:
        return wg.Inventory(
            generation=generation,
            residents=[
                wg.ResidentModel(
                    deployment_id=r.deployment_id,
                    artifact_digest=r.artifact_digest,
                    environment_id=r.environment_id,
                    state=common_pb2.RESIDENCY_STATE_RESIDENT,
                    pid=r.host.pid,
                    rss_bytes=r.host.ready.rss_bytes,
                )
                for r in self._residents.values()
                if r.host.alive
            ],
        )

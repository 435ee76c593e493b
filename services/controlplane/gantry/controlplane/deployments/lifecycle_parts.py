"""The parts a service that acts through the deployment lifecycle holds, given by keyword once.

Node and deployment admin, the evidence pipeline, the reconciler and its autoscaler each commit
through the database (recording there the events its commit publishes), reach workers through
the hub, dispatch through the lifecycle and read the time from the clock; they take these four
the same way (`**parts: Unpack[LifecycleParts]`) and keep them under the same names.
"""

from __future__ import annotations

from typing import TypedDict, Unpack

from gantry.common.clock import Clock
from gantry.controlplane.deployments.lifecycle import DeploymentLifecycle
from gantry.controlplane.nodes.sessions import WorkerHub
from gantry.controlplane.platform.database import Database


class LifecycleParts(TypedDict):
    database: Database
    hub: WorkerHub
    lifecycle: DeploymentLifecycle
    clock: Clock


class LifecycleService:
    """Holds a service's lifecycle parts as `_database`, `_hub`, `_lifecycle` and `_clock`."""

    def __init__(self, **parts: Unpack[LifecycleParts]) -> None:
        self._database = parts["database"]
        self._hub = parts["hub"]
        self._lifecycle = parts["lifecycle"]
        self._clock = parts["clock"]

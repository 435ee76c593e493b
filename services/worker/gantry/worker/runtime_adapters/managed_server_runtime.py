"""The lifecycle of adapters whose model a managed server process serves (`managed_server`).

It is `ModelHostRuntime`'s lifecycle with another process behind it: `prepare` (the environment
must list the server kind, the bytes are verified into a private copy), `start` (the server is
launched on a loopback port the worker allocates), `probe` (one real token, the server's RSS from
/proc), `health`, `stop` and `unload` (SIGTERM, grace, SIGKILL, reaped, verified gone) all go
through the same methods, which only ask the process for what `ManagedServer` answers. What
differs is said here: how it starts, that a model-host factory never starts it, and that a
server reports no CUDA allocator readings.
"""

from __future__ import annotations

from typing import ClassVar

from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.managed_server.server_calls import NO_CUDA_READINGS
from gantry.worker.managed_server.server_process import ManagedServer
from gantry.worker.nvml_readings import Nvml
from gantry.worker.runtime_adapters.base import RunningRuntime, Support, Unloaded
from gantry.worker.runtime_adapters.model_host_runtime import (
    ModelHostRuntime,
    ProbeHostFactory,
)


class ManagedServerRuntime(ModelHostRuntime):
    """An adapter served by a managed server kind of the same name (`managed_server.kinds`)."""

    # The static inspector whose layouts this kind serves ("gguf", "transformers").
    inspector: ClassVar[str]

    def __init__(self, *, host_factory: ProbeHostFactory | None = None) -> None:
        super().__init__(host_factory=host_factory or ManagedServer.start)

    def launched_by(self, host_factory: ProbeHostFactory) -> ModelHostRuntime:
        # A test's or a warm pool's factory starts model hosts; a server is never one of them.
        return self

    def inspect_support(self, inspection: wg.Inspection) -> Support:
        if inspection.inspector != self.inspector:
            return Support(
                adapter=self.name,
                supported=False,
                reason=f"serves {self.inspector} layouts, not {inspection.inspector}",
            )
        if inspection.task not in ("generation", "text-generation"):
            return Support(
                adapter=self.name,
                supported=False,
                reason=f"serves text generation, not {inspection.task or 'an unknown task'}",
            )
        return Support(adapter=self.name, supported=True)

    async def unload(self, running: RunningRuntime, *, grace_s: float, nvml: Nvml) -> Unloaded:
        unloaded = await super().unload(running, grace_s=grace_s, nvml=nvml)
        return Unloaded(
            stopped=unloaded.stopped,
            reclaim=unloaded.reclaim,
            cuda_allocated_after_unload=common_pb2.Measurement(
                unavailable=NO_CUDA_READINGS, source="managed server"
            ),
        )

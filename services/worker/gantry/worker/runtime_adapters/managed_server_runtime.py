"""The lifecycle of adapters whose model a managed server process serves (`managed_server`).

It is `ModelHostRuntime`'s lifecycle with another process behind it: `prepare` (the environment
must list the server kind, the bytes are verified into a private copy), `start` (the server is
launched on a loopback port the worker allocates), `probe` (one real token, the server's RSS from
/proc), `health`, `stop` and `unload` (SIGTERM, grace, SIGKILL, reaped, verified gone) all go
through the same methods, which only ask the process for what `ManagedServer` answers. What
differs is said here: how it starts, that a model-host factory never starts it, and that a
server reports no CUDA allocator readings. Its layout is a `layouts.LayoutMatch` like every
model-host adapter's.
"""

from __future__ import annotations

from gantry.v1 import common_pb2
from gantry.worker.managed_server.server_calls import NO_CUDA_READINGS
from gantry.worker.managed_server.server_process import ManagedServer
from gantry.worker.nvml_readings import Nvml
from gantry.worker.runtime_adapters.base import RunningRuntime, Unloaded
from gantry.worker.runtime_adapters.layouts import LayoutMatch
from gantry.worker.runtime_adapters.model_host_runtime import (
    ModelHostRuntime,
    ProbeHostFactory,
)


def served_generation(inspector: str) -> LayoutMatch:
    """The layout a managed server kind serves: text generation read by `inspector`."""
    return LayoutMatch(
        verb="serves",
        runs="text generation",
        inspector=inspector,
        task="generation",
        task_aliases=("text-generation",),
        names_model_type=False,
    )


class ManagedServerRuntime(ModelHostRuntime):
    """An adapter served by a managed server kind of the same name (`managed_server.kinds`);
    its `layout` is a `served_generation` (what static inspection must have found)."""

    def __init__(self, *, host_factory: ProbeHostFactory | None = None) -> None:
        super().__init__(host_factory=host_factory or ManagedServer.start)

    def launched_by(self, host_factory: ProbeHostFactory) -> ModelHostRuntime:
        # A test's or a warm pool's factory starts model hosts; a server is never one of them.
        return self

    async def unload(self, running: RunningRuntime, *, grace_s: float, nvml: Nvml) -> Unloaded:
        unloaded = await super().unload(running, grace_s=grace_s, nvml=nvml)
        return Unloaded(
            stopped=unloaded.stopped,
            reclaim=unloaded.reclaim,
            cuda_allocated_after_unload=common_pb2.Measurement(
                unavailable=NO_CUDA_READINGS, source="managed server"
            ),
        )

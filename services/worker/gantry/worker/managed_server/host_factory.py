"""Which process a resident gets: a managed server for a server kind's adapter, a model host
for every other. Supervision sees one `HostFactory` and restarts either the same way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gantry.worker.managed_server.kinds import server_kind
from gantry.worker.managed_server.server_process import ManagedServer
from gantry.worker.model_host.process import HostLaunchSpec
from gantry.worker.residents import HostFactory, SupervisedHost


def serving_host_factory(model_hosts: HostFactory) -> HostFactory:
    """`model_hosts` for model-host adapters, `ManagedServer.start` for managed server kinds."""

    async def start(
        spec: HostLaunchSpec,
        *,
        on_exit: Any = None,
        trace_context: Mapping[str, str] | None = None,
    ) -> SupervisedHost:
        if server_kind(spec.adapter.adapter) is not None:
            return await ManagedServer.start(spec, on_exit=on_exit, trace_context=trace_context)
        return await model_hosts(spec, on_exit=on_exit, trace_context=dict(trace_context or {}))

    return start

"""The worker's runtime adapters: one module per adapter, chosen by name in `registry`."""

from gantry.worker.runtime_adapters.base import (
    AdapterFacts,
    Prepared,
    PrepareRequest,
    RunningRuntime,
    RuntimeAdapter,
    StartRequest,
    Support,
    Unloaded,
)
from gantry.worker.runtime_adapters.registry import (
    DEFAULT_ADAPTER,
    adapter_name,
    registered_adapters,
    runtime_adapter_for,
)

__all__ = [
    "DEFAULT_ADAPTER",
    "AdapterFacts",
    "PrepareRequest",
    "Prepared",
    "RunningRuntime",
    "RuntimeAdapter",
    "StartRequest",
    "Support",
    "Unloaded",
    "adapter_name",
    "registered_adapters",
    "runtime_adapter_for",
]

"""The worker's runtime adapters: one module per adapter, chosen by name in `registry`.

The package's front door is the lookup by name; the lifecycle's types are `base`'s.
"""

from gantry.worker.runtime_adapters.registry import (
    DEFAULT_ADAPTER,
    adapter_name,
    registered_adapters,
    runtime_adapter_for,
)

__all__ = ["DEFAULT_ADAPTER", "adapter_name", "registered_adapters", "runtime_adapter_for"]

"""The sandbox probe of serving.py's test hooks, run inside a model host and read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gantry.common.errors import GantryError
from gantry.worker.model_host.process import ModelHost
from gantry.worker.model_host.serving import TEST_HOOK_PROBE_MARKER, TEST_HOOK_PROBE_SANDBOX_PREFIX


async def sandbox_report(host: ModelHost, path: Path, port: int) -> dict[str, object]:
    """Run the probe hook inside the host (a host started with the test hooks on): it tries to
    read `path` and to connect to 127.0.0.1:`port`, and its report comes back as the forward
    pass's failure."""
    with pytest.raises(GantryError) as failure:
        await host.embed(
            [f"{TEST_HOOK_PROBE_SANDBOX_PREFIX}{path}:{port}"], trace_context={}, timeout_s=30
        )
    message = failure.value.message
    assert TEST_HOOK_PROBE_MARKER in message, message
    report = json.loads(message.split(TEST_HOOK_PROBE_MARKER, 1)[1])
    assert isinstance(report, dict)
    return report

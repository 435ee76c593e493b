"""A real model host follows the worker's GANTRY_LOG_FORMAT=json: its stderr, which the worker
drains into its own log, is one JSON object per line naming the role and the deployment."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gantry.v1 import common_pb2
from gantry.worker.model_host.process import HostLaunchSpec
from tests.integration.harness import forked_host, wait_for


async def test_a_model_host_logs_json_lines_when_the_worker_does(tiny_model_dir: Path) -> None:
    host = await forked_host(
        HostLaunchSpec(
            deployment_id="dep-json-logs",
            model_directory=tiny_model_dir,
            adapter=common_pb2.AdapterSettings(adapter="sentence_transformers", device="cpu"),
            python_executable=sys.executable,
            # Reaches the child only through INHERITED_ENVIRONMENT, like the worker's own.
            env={"GANTRY_LOG_FORMAT": "json"},
            load_timeout_s=90,
        )
    )
    try:

        def ready_logged() -> bool:
            return any('"ready: adapter=' in line for line in host.stderr_tail())

        await wait_for(ready_logged, timeout=30, what="the host's ready line")
        records = [json.loads(line) for line in host.stderr_tail() if line.startswith("{")]
        ready = [r for r in records if str(r["message"]).startswith("ready: adapter=")]
        assert len(ready) == 1
        assert ready[0]["role"] == "model-host"
        assert ready[0]["deployment_id"] == "dep-json-logs"
        assert ready[0]["level"] == "INFO"
    finally:
        await host.stop()

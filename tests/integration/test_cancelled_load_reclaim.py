"""A cancelled LOAD (an UNLOAD overtaking it, a CancelJob) is judged as a failed one: its child is
killed, and custody ends only when the child is proven gone by the reclaim rule
(`reclaim_verdict`), never after a bounded wait. The child is a real managed server process that
never answers; NVML is the one fake (the file-backed table, or none that reads).
"""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from gantry.common.errors import GantryError
from gantry.worker.managed_server.kinds import LLAMA_CPP_SERVER, SERVER_KINDS
from gantry.worker.managed_server.server_process import ManagedServer, ServerLaunch
from gantry.worker.model_host.process import HostLaunchSpec
from gantry.worker.residents import UNCERTAIN
from gantry.worker.supervision import Supervisor
from tests.fixtures.serving_adapters import RecordingAdapters, serving_load
from tests.integration.harness import wait_for
from tests.integration.test_failed_load_reclaim import FACTS, QUIET, SwitchableNvml, _on

# Says it started (a file), then never answers: its start can only end by being cancelled.
_NEVER_ANSWERS = """
import pathlib, signal, sys
pathlib.Path(sys.argv[1]).write_text("started")
signal.pause()  # until it is killed
"""


def _never_answering(tmp_path: Path) -> tuple[Any, Path]:
    """A host factory whose server starts and never answers, and the file it writes when up."""
    script, started = tmp_path / "never_answers.py", tmp_path / "started"
    script.write_text(_NEVER_ANSWERS)

    async def factory(spec: HostLaunchSpec, **_: object) -> ManagedServer:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        return await ManagedServer.launch(
            ServerLaunch(
                deployment_id=spec.deployment_id,
                kind=SERVER_KINDS[LLAMA_CPP_SERVER],
                argv=(sys.executable, "-I", str(script), str(started)),
                executable=sys.executable,
                port=port,
                served_name=spec.deployment_id,
                load_timeout_s=60.0,
            )
        )

    return factory, started


async def test_an_unload_that_overtakes_a_gpu_load_keeps_custody_until_nvml_proves_it_gone(
    tmp_path: Path,
) -> None:
    nvml = SwitchableNvml(tmp_path / "gpus.json")
    factory, started = _never_answering(tmp_path)
    supervisor = Supervisor(
        QUIET,
        on_change=lambda: None,
        host_factory=factory,
        adapters=RecordingAdapters(),
        open_nvml=nvml,
    )
    load = _on("cuda", serving_load("dep-cancel"))
    loading = asyncio.create_task(supervisor.load("dep-cancel", FACTS, load, trace_context={}))
    try:
        await wait_for(started.exists, what="the server child to start")
        overtaking = await supervisor.unload("dep-cancel")
        with pytest.raises(GantryError) as overtaken:
            await loading
        assert overtaken.value.reason == "INVALID_STATE_TRANSITION"
        # Killed and reaped, but on a GPU with NVML unreadable: not a clean exit.
        assert overtaking.pid != 0 and overtaking.process_exited
        assert not overtaking.reclaim.reclaimed
        assert "NVML could not be read" in overtaking.reclaim.detail
        resident = supervisor.residents.get("dep-cancel")
        assert resident is not None and resident.state == UNCERTAIN  # the charge is kept
        assert resident.last_failure is not None
        assert resident.last_failure.reason == "RECLAIM_UNVERIFIED"

        nvml.readable = True  # NVML reads and no longer lists the pid: proven gone
        proven = await supervisor.unload("dep-cancel")
        assert proven.pid == overtaking.pid and proven.reclaim.reclaimed
        assert supervisor.residents.get("dep-cancel") is None
    finally:
        loading.cancel()
        await supervisor.shutdown()


async def test_a_cancelled_cpu_load_is_released_once_its_child_is_reaped(tmp_path: Path) -> None:
    nvml = SwitchableNvml(tmp_path / "gpus.json")  # unreadable: a CPU child needs none
    factory, started = _never_answering(tmp_path)
    supervisor = Supervisor(
        QUIET,
        on_change=lambda: None,
        host_factory=factory,
        adapters=RecordingAdapters(),
        open_nvml=nvml,
    )
    load = serving_load("dep-cpu-cancel")
    loading = asyncio.create_task(supervisor.load("dep-cpu-cancel", FACTS, load, trace_context={}))
    try:
        await wait_for(started.exists, what="the server child to start")
        loading.cancel()  # as CancelJob does
        with pytest.raises(asyncio.CancelledError):
            await loading
        assert supervisor.residents.get("dep-cpu-cancel") is None
    finally:
        await supervisor.shutdown()

"""A real `gantry worker` with six resident model hosts, one of them busy in a forward pass that
never ends, stopped the way `gantry up` stops it: its supervisor's SIGTERM, then SIGKILL once
the grace `gantry up` gives the worker has passed. The worker must exit 0 by itself within that
grace, every model host it reported reaped by it (gone, not a zombie).

The grace is the product's own (`gantry.cli.up.child_specs`), so this test holds no timing bound
of its own. The scheduler and control plane run in this process; the worker forks its hosts from
its own warm pool, as under `gantry up`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import psutil
import pytest

from gantry.cli.supervisor import ChildSpec, StopResult, Supervisor
from gantry.cli.up import WORKER_STOP_TIMEOUT_S
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.worker.model_host.proc_facts import process_identity
from gantry.worker.model_host.serving import TEST_HOOK_HANG_INPUT
from tests.fixtures.host_test_hooks import worker_argv
from tests.integration.harness import Harness, running_gantry, wait_for

RESIDENTS = 6
READY = cp.DEPLOYMENT_STATE_READY


@pytest.fixture
async def gantry(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        yield harness


def _reaped(pid: int, started: psutil.Process | None) -> bool:
    """Gone: no process at the pid, or a later one that reused it. A zombie keeps its entry and
    its start time, so an unreaped host does not pass."""
    now = process_identity(pid)
    return now is None or now != started


async def _connected(harness: Harness) -> bool:
    nodes = await harness.operator.ListNodes(cp.ListNodesRequest(), metadata=harness.op_md)
    return any(node.state == common_pb2.NODE_STATE_CONNECTED for node in nodes.nodes)


@pytest.mark.timeout(300)
async def test_six_resident_hosts_one_busy_the_worker_stops_within_its_grace(
    gantry: Harness, tmp_path: Path, tiny_model_dir: Path
) -> None:
    credential = tmp_path / "node.credential"
    credential.write_text(await gantry.register_node("stopping") + "\n")
    log_path = tmp_path / "worker.log"
    reports: list[str] = []
    # `gantry worker`, its model hosts taking the magic inputs (a test entry point).
    argv = worker_argv(
        "--control-plane", gantry.address,
        "--credential-file", str(credential),
        "--artifact-root", str(gantry.artifact_root),
        "--heartbeat-file", str(tmp_path / "heartbeat"),
    )  # fmt: skip
    supervisor = Supervisor(report=reports.append)
    supervisor.start(
        ChildSpec(
            name="worker",
            argv=argv,
            log_path=log_path,
            env=dict(os.environ),
            stop_timeout_s=WORKER_STOP_TIMEOUT_S,
        )
    )
    hung: asyncio.Future[inf.EmbedResponse] | None = None
    stopped: StopResult | None = None
    try:
        await wait_for(lambda: _connected(gantry), timeout=120, what="the worker to connect")
        artifact = await gantry.register_model(tiny_model_dir, "tiny")
        approval = await gantry.approve(artifact.artifact_set_id, "tiny")
        created = [
            await gantry.create_deployment(approval, f"tiny-{index}") for index in range(RESIDENTS)
        ]
        hosts: dict[int, psutil.Process | None] = {}
        for deployment in created:
            ready = await gantry.wait_deployment(deployment.deployment_id, READY, timeout=120)
            pid = ready.residencies[0].pid
            hosts[pid] = process_identity(pid)
        assert len(hosts) == RESIDENTS and None not in hosts.values()

        # One host busy in a forward pass that never returns: it cannot read a Shutdown.
        hung = asyncio.ensure_future(
            gantry.inference.Embed(
                inf.EmbedRequest(capability="tiny-0", inputs=[TEST_HOOK_HANG_INPUT]),
                metadata=gantry.client_md,
            )
        )
        await wait_for(
            lambda: "test hook: hanging the forward pass" in log_path.read_text(),
            timeout=60,
            what="a model host hung in its forward pass",
        )
        # What `gantry up` does on Ctrl-C: SIGTERM, SIGKILL after the worker's grace.
        [stopped] = await asyncio.to_thread(supervisor.stop_all)
    finally:
        if hung is not None:
            hung.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await hung
        if stopped is None:  # failed before its stop: kill and reap what it started
            supervisor.force_stop()
            await asyncio.to_thread(supervisor.stop_all)
    log = log_path.read_text()
    assert (stopped.killed, stopped.returncode) == (False, 0), f"{reports}\n{log[-6000:]}"
    assert [pid for pid, started in hosts.items() if not _reaped(pid, started)] == [], log[-6000:]
    # One line per host, saying how it ended and how long its stop took; the busy one never
    # read a Shutdown, so SIGTERM (sent to every host at once) is what ended each of them.
    for pid in hosts:
        [line] = [line for line in log.splitlines() if f" stopped: pid={pid} " in line]
        assert re.search(r"signal SIG(TERM|KILL) exited=True in \d+\.\d\ds$", line), line
    assert re.search(r"stopped in \d+\.\d\ds \(bound \d+s\)$", log, re.MULTILINE), log[-2000:]

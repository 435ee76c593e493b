"""`--control-plane dns:///NAME:PORT`: the worker resolves the name (at start, and again every
`resolve_interval_s`) and holds a stream to each address it resolves to, dialled by its IP with the
name as the authority. Here the name is `localhost` and the control plane listens on 127.0.0.1:
its stream is the one welcomed (an IPv6 address the name may also list has no listener, and its
stream keeps dialling)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gantry.common.client_config import resolve_hosts
from gantry.worker.agent import WorkerAgent, WorkerSettings
from tests.integration.harness import running_gantry, wait_for


async def test_a_worker_given_a_dns_name_holds_a_stream_to_each_address_it_resolves_to(
    sqlite_url: str, tmp_path: Path
):
    async with running_gantry(sqlite_url, tmp_path) as harness:
        credential = await harness.register_node("by-name")
        port = harness.control_plane.port
        agent = WorkerAgent(
            WorkerSettings(
                control_plane=f"dns:///localhost:{port}",
                credential=credential,
                artifact_root=tmp_path,
                resolve_interval_s=0.2,  # resolved again while the test runs
                warm_pool=False,
            )
        )
        harness.workers.append((agent, asyncio.create_task(agent.run())))
        await wait_for(lambda: agent.connected.is_set(), what="the stream to 127.0.0.1")
        expected = {
            f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
            for ip in resolve_hosts(["localhost"])["localhost"]
        }
        assert f"127.0.0.1:{port}" in expected
        streams = agent.streams()
        assert set(streams) == expected
        assert {target.authority for target in streams.values()} == {f"localhost:{port}"}
        assert harness.control_plane.hub.get(agent.node_id) is not None

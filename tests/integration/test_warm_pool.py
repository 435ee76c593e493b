"""Model hosts forked by the warm pool, for real: a fork server that imported torch, hosts that
serve, sandboxed and reaped like spawned ones, and a server whose death leaves them running."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2, worker_gateway_pb2
from gantry.worker.model_host import landlock
from gantry.worker.model_host.environments import (
    INHERITED_ENVIRONMENT,
    OFFLINE_ENVIRONMENT,
    TEST_HOOKS_VARIABLE,
)
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost
from gantry.worker.model_host.warm_pool import ForkServer, WarmPool
from tests.integration.harness import shared_warm_pool
from tests.integration.polling import wait_until
from tests.integration.sandbox_probe import sandbox_report

# What a host may find in its environment: allow-listed names, the forced flags, its own dirs,
# and the test hooks' switch these tests start their hosts with (`test_hooks=True`).
HOST_VARIABLES = set(INHERITED_ENVIRONMENT) | set(OFFLINE_ENVIRONMENT) | {"PATH", "HOME", "TMPDIR"}
HOST_VARIABLES |= {TEST_HOOKS_VARIABLE}
WORKER_SECRET = {"MY_SECRET": "hunter2-fake-secret"}
SENTENCES = ["hello world", "the quick brown fox jumps over the lazy dog"]


def _spec(model_directory: Path, deployment_id: str, **overrides: object) -> HostLaunchSpec:
    fields: dict[str, object] = {
        "deployment_id": deployment_id,
        "model_directory": model_directory,
        "adapter": common_pb2.AdapterSettings(adapter="sentence_transformers", device="cpu"),
        "python_executable": sys.executable,
        "test_hooks": True,
        "load_timeout_s": 300,
    }
    fields.update(overrides)
    return HostLaunchSpec(**fields)  # type: ignore[arg-type]


def _vectors(result: worker_gateway_pb2.EmbedResult) -> np.ndarray:
    return np.frombuffer(result.float32_le, dtype="<f4").reshape(result.count, result.dim)


def _parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise AssertionError(f"no Pss in /proc/{pid}/smaps_rollup")


def _server(pool: WarmPool) -> ForkServer:
    server = pool.server_for_environment(sys.executable, os.environ)
    assert server is not None, "the pool has no running server for this environment"
    return server


@pytest.fixture
def pool() -> WarmPool:
    # Shared with the harness's workers: its server imports torch once per pytest process.
    return shared_warm_pool()


@pytest.fixture
def listening_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


async def test_forked_host_embeds_like_a_spawned_one_and_the_worker_reaps_it(
    tiny_model_dir: Path, pool: WarmPool
) -> None:
    spawned = await ModelHost.start(_spec(tiny_model_dir, "dep-spawned"))
    forked = await ModelHost.start(_spec(tiny_model_dir, "dep-forked"), warm_pool=pool)
    try:
        server = _server(pool)
        assert forked.ready.pid == forked.pid != server.process.pid
        # Reparented through the double fork: the worker is the parent, not the server.
        assert _parent_of(forked.pid) == os.getpid()
        assert _threads_of(server.process.pid) == 1  # nothing else ran in it when it forked
        title = Path(f"/proc/{forked.pid}/cmdline").read_bytes().split(b"\0")[0]
        assert title == b"gantry model-host dep-forked"  # what `ps` shows, as for a spawned one
        assert forked.ready.dim == spawned.ready.dim == 32
        assert forked.isolation == spawned.isolation
        from_spawned = await spawned.embed(SENTENCES, trace_context={}, timeout_s=30)
        from_forked = await forked.embed(SENTENCES, trace_context={}, timeout_s=30)
        np.testing.assert_allclose(_vectors(from_forked), _vectors(from_spawned), atol=1e-5)
        private_dir = Path(os.readlink(f"/proc/{forked.pid}/cwd"))
    finally:
        await spawned.stop()
        evidence = await forked.stop()

    assert evidence == worker_gateway_pb2.UnloadEvidence(
        pid=forked.pid, process_exited=True, has_exit_code=True, exit_code=0
    )
    assert not Path(f"/proc/{forked.pid}").exists()  # reaped by this process, not a zombie
    assert not private_dir.exists()


async def test_forked_host_is_sandboxed_like_a_spawned_one_without_the_workers_secrets(
    tiny_model_dir: Path,
    pool: WarmPool,
    tmp_path: Path,
    listening_port: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in WORKER_SECRET.items():
        monkeypatch.setenv(name, value)
    outside = tmp_path / "outside.txt"
    outside.write_text("not for hosts\n")
    outside.chmod(0o644)

    reports = {}
    for how, warm_pool in (("spawned", None), ("forked", pool)):
        host = await ModelHost.start(_spec(tiny_model_dir, f"dep-{how}"), warm_pool=warm_pool)
        try:
            private_dir = Path(os.readlink(f"/proc/{host.pid}/cwd"))
            reports[how] = await sandbox_report(host, outside, listening_port)
            reports[how]["private_dir"] = str(private_dir)
            reports[how]["isolation"] = host.ready.isolation
            # The sandbox did not break the host: it still serves.
            assert (await host.embed(["hello"], trace_context={}, timeout_s=30)).count == 1
        finally:
            await host.stop()

    spawned, forked = reports["spawned"], reports["forked"]
    assert forked["isolation"] == spawned["isolation"]
    assert (forked["read"], forked["connect"]) == (spawned["read"], spawned["connect"])
    try:
        landlock.abi_version()
    except landlock.LandlockUnavailable:
        pass
    else:
        assert forked["read"] == "denied EACCES"
    environment = forked["environ"]
    assert isinstance(environment, dict)
    inherited = {name for name in environment if not name.startswith(("KMP_", "TORCHINDUCTOR_"))}
    assert inherited <= HOST_VARIABLES, inherited - HOST_VARIABLES
    assert not set(WORKER_SECRET) & set(environment)
    assert environment["HOME"] == forked["private_dir"] == forked["cwd"]
    assert Path(environment["TMPDIR"]).parent == Path(str(forked["private_dir"]))
    assert forked["isolated_flag"] == 1
    assert forked["sys_path"] == spawned["sys_path"]


async def test_a_load_through_the_pool_runs_on_the_servers_imports_not_its_own(
    tiny_model_dir: Path, pool: WarmPool
) -> None:
    """What makes a warm load a fraction of a cold spawn: the server imported the ML stack before
    it forked, and a forked host runs on those pages instead of importing its own. (How long each
    takes is the bench's to measure: tests/bench/warm_pool.py, against PERFORMANCE.md's target.)"""
    warming = await ModelHost.start(_spec(tiny_model_dir, "dep-warming"), warm_pool=pool)
    await warming.stop()
    server = _server(pool)
    # The imports a warm load skips were done in the server (torch's library is mapped there).
    assert "libtorch" in Path(f"/proc/{server.process.pid}/maps").read_text()

    started = time.monotonic()
    cold = await ModelHost.start(_spec(tiny_model_dir, "dep-cold"))
    cold_s = time.monotonic() - started
    started = time.monotonic()
    warm = await ModelHost.start(_spec(tiny_model_dir, "dep-warm"), warm_pool=pool)
    warm_s = time.monotonic() - started
    try:
        # Forked from that server, not spawned: it shares the server's pages, so it holds far
        # less memory of its own than a spawned host that imported everything itself.
        assert _pss_kib(warm.pid) < _pss_kib(cold.pid)
        assert _server(pool) is server  # the same server, still running after the fork
    finally:
        await cold.stop()
        await warm.stop()
    print(f"\nModelHost.start: spawned {cold_s:.2f}s, forked from the pool {warm_s:.2f}s")


async def test_a_server_that_cannot_start_fails_the_load_typed_and_never_spawns_instead(
    tiny_model_dir: Path, pool: WarmPool
) -> None:
    # /bin/false is no Python: its fork server exits before it is ready.
    with pytest.raises(GantryError) as refused:
        await ModelHost.start(
            _spec(tiny_model_dir, "dep-no-server", python_executable="/bin/false"),
            warm_pool=pool,
        )
    assert refused.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert "fork server" in refused.value.message
    assert pool.server_for_environment("/bin/false", os.environ) is None


async def test_killing_the_fork_server_leaves_its_hosts_serving_and_the_next_load_starts_one(
    tiny_model_dir: Path, pool: WarmPool
) -> None:
    first = await ModelHost.start(_spec(tiny_model_dir, "dep-before"), warm_pool=pool)
    try:
        server = _server(pool)
        os.kill(server.process.pid, signal.SIGKILL)
        await wait_until(lambda: not server.alive, timeout_s=10, what="the server to die")

        # Its host is the worker's child, not the server's: it lives on and serves.
        assert first.alive
        assert (await first.embed(SENTENCES, trace_context={}, timeout_s=30)).count == 2

        second = await ModelHost.start(_spec(tiny_model_dir, "dep-after"), warm_pool=pool)
        try:
            assert _server(pool).process.pid != server.process.pid
            assert _parent_of(second.pid) == os.getpid()
            assert (await second.embed(SENTENCES, trace_context={}, timeout_s=30)).count == 2
        finally:
            assert (await second.stop()).process_exited
    finally:
        assert (await first.stop()).process_exited
    assert not Path(f"/proc/{first.pid}").exists()

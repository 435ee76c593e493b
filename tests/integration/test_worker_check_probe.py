"""`gantry worker --check` against a real `gantry worker` process welcomed by the in-process
control plane: live while it heartbeats, still live (and saying so) while the control plane is
gone, not live once the worker has stopped, not live before any file.
The worker logs with GANTRY_LOG_FORMAT=json, so its log is read back as JSON records too.

The control plane's Welcome names a 0.5 s heartbeat interval, so the probe's default patience
(three intervals, read from the file) is 1.5 s and the test needs no long waits.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.worker.heartbeat_file import HeartbeatRecord
from tests.integration.harness import Harness, running_gantry, wait_for

GANTRY = Path(sys.executable).with_name("gantry")  # the installed entry point
HEARTBEAT_S = 0.5


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    settings = ReconcilerSettings(interval_s=0.2, heartbeat_interval_s=HEARTBEAT_S)
    async with running_gantry(database_url, root, reconciler=settings) as harness:
        yield harness


async def probe(*arguments: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [str(GANTRY), "worker", "--check", *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_the_probe_passes_while_a_real_worker_heartbeats_and_fails_once_it_stops(
    gantry: Harness, tmp_path: Path
) -> None:
    """Connected, then cut off by a stopped control plane (live: its loop still ticks), then
    stopped itself (stale)."""
    heartbeat = tmp_path / "worker" / "heartbeat"
    credential = tmp_path / "node.credential"
    credential.write_text(await gantry.register_node("probed") + "\n")
    log = (tmp_path / "worker.log").open("w")
    worker = await asyncio.create_subprocess_exec(
        str(GANTRY),
        "worker",
        "--control-plane",
        gantry.address,
        "--credential-file",
        str(credential),
        "--artifact-root",
        str(gantry.artifact_root),
        "--no-warm-pool",  # no fork server importing torch: this test loads no model
        "--heartbeat-file",
        str(heartbeat),
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "GANTRY_LOG_FORMAT": "json"},
    )
    try:
        # Written from the loop's first tick, before any Welcome ...
        await wait_for(heartbeat.exists, timeout=60, what="the worker's first heartbeat file")
        # ... and connected once welcomed.
        await wait_for(
            lambda: HeartbeatRecord.from_json(heartbeat.read_text()).connected,
            timeout=60,
            what="a heartbeat record written while welcomed",
        )
        first = HeartbeatRecord.from_json(heartbeat.read_text())
        assert first.pid == worker.pid
        assert first.interval_s == HEARTBEAT_S  # as the Welcome named it
        assert first.disconnected_since is None

        # Rewritten by heartbeats, not only at the Welcome.
        await wait_for(
            lambda: HeartbeatRecord.from_json(heartbeat.read_text()).sent_at > first.sent_at,
            timeout=10,
            what="a heartbeat after the Welcome",
        )
        live = await probe("--heartbeat-file", str(heartbeat))
        assert live.returncode == 0, live.stderr
        assert live.stdout.startswith("live: heartbeat ")
        assert ", connected (" in live.stdout
        assert f"pid {worker.pid}" in live.stdout

        # The control plane goes away: a liveness probe must not restart the worker for that.
        await gantry.control_plane.stop()
        await wait_for(
            lambda: not HeartbeatRecord.from_json(heartbeat.read_text()).connected,
            timeout=30,
            what="the worker to record that it is disconnected",
        )
        cut_off = HeartbeatRecord.from_json(heartbeat.read_text())
        assert cut_off.disconnected_since is not None and cut_off.pid == worker.pid
        # Past the probe's default patience (three 0.5 s intervals) and through the reconnect
        # backoff's first doublings: the file is still rewritten, as the worker's own records say.
        well_into_the_outage = cut_off.disconnected_since + dt.timedelta(
            seconds=4 * 3 * HEARTBEAT_S
        )
        await wait_for(
            lambda: (
                HeartbeatRecord.from_json(heartbeat.read_text()).sent_at >= well_into_the_outage
            ),
            timeout=30,
            what=f"a heartbeat written {4 * 3 * HEARTBEAT_S:g}s into the outage",
        )
        outage = await probe("--heartbeat-file", str(heartbeat))
        assert outage.returncode == 0, outage.stderr
        assert ", disconnected for " in outage.stdout and "reconnecting" in outage.stdout
        later = HeartbeatRecord.from_json(heartbeat.read_text())
        assert later.sent_at > cut_off.sent_at
        assert later.disconnected_since == cut_off.disconnected_since
    finally:
        worker.send_signal(signal.SIGTERM)
        await asyncio.wait_for(worker.wait(), 60)
        log.close()

    stopped_at = HeartbeatRecord.from_json(heartbeat.read_text()).sent_at
    # Staleness is the record's age: wait until it is past the default patience (three 0.5 s
    # intervals), which the probes below judge it by.
    await wait_for(
        lambda: dt.datetime.now(dt.UTC) - stopped_at > dt.timedelta(seconds=3 * HEARTBEAT_S),
        timeout=10,
        what="the last heartbeat record to age past three intervals",
    )
    stale = await probe("--heartbeat-file", str(heartbeat), "--max-age-s", "0.5")
    assert stale.returncode == 1
    assert stale.stdout == ""
    assert stale.stderr.startswith("not live: heartbeat stale by ")
    assert stale.stderr.count("\n") == 1, stale.stderr
    # The default patience comes from the file: three of the Welcome's 0.5 s intervals.
    default = await probe("--heartbeat-file", str(heartbeat))
    assert default.returncode == 1
    assert "max age 1.5 s" in default.stderr
    assert HeartbeatRecord.from_json(heartbeat.read_text()).sent_at == stopped_at

    records = [
        json.loads(line)
        for line in (tmp_path / "worker.log").read_text().splitlines()
        if line.startswith("{")
    ]
    welcomed = [r for r in records if str(r["message"]).startswith("welcomed as node")]
    assert welcomed  # once per stream: a loaded machine may see it reconnect
    assert {(r["role"], r["level"], r["logger"]) for r in welcomed} == {
        ("worker", "INFO", "gantry.worker.agent")
    }


async def test_the_probe_fails_without_a_file_and_needs_no_credential(tmp_path: Path) -> None:
    missing = tmp_path / "never-written"
    result = await probe("--heartbeat-file", str(missing))
    assert result.returncode == 1
    assert result.stderr == (
        f"not live: no heartbeat file yet: no worker loop has written it ({missing})\n"
    )
    assert "Traceback" not in result.stderr

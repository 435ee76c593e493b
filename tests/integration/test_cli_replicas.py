"""The CLI against a real in-process control plane listed beside a dead replica: `--address
a,b` and `<state>/control-planes` are both honoured, reads and `gantry bench` reach the live
replica, and every call goes through the documented client settings."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gantry.cli.main import main as gantry_cli
from tests.integration.harness import Harness, running_gantry
from tests.integration.test_client_replicas import dead_address


@pytest.fixture
async def gantry(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        await harness.register_node("replica-test-node")
        yield harness


@pytest.fixture
def state(gantry: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("GANTRY_ADDRESS", raising=False)  # the file is read only without it
    directory = tmp_path / "state"
    directory.mkdir()
    (directory / "operator.token").write_text(gantry.operator_token + "\n")
    (directory / "client.key").write_text(gantry.api_key + "\n")
    return directory


async def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    # The CLI runs its own calls; the servers share this loop, so it runs in a thread.
    status = await asyncio.to_thread(gantry_cli, list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def node_names(printed: str) -> list[str]:
    document: Any = json.loads(printed)
    return [node["name"] for node in document]


async def test_address_lists_a_dead_replica_and_a_live_one(
    gantry: Harness, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for replicas in (f"{dead_address()},{gantry.address}", f"{gantry.address},{dead_address()}"):
        status, out, err = await run_cli(
            capsys, "--address", replicas, "--state-dir", str(state), "nodes", "-o", "json"
        )
        assert (status, err) == (0, "")
        assert node_names(out) == ["replica-test-node"]


async def test_the_control_planes_file_names_the_replicas(
    gantry: Harness, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (state / "control-planes").write_text(f"{dead_address()}\n{gantry.address}\n")
    status, out, err = await run_cli(capsys, "--state-dir", str(state), "nodes", "-o", "json")
    assert (status, err) == (0, "")
    assert node_names(out) == ["replica-test-node"]


async def test_the_flag_beats_a_file_of_dead_replicas(
    gantry: Harness, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (state / "control-planes").write_text(f"{dead_address()}\n{dead_address()}\n")
    status, out, _ = await run_cli(
        capsys, "--address", gantry.address, "--state-dir", str(state), "nodes", "-o", "json"
    )
    assert status == 0 and node_names(out) == ["replica-test-node"]
    status, out, err = await run_cli(capsys, "--state-dir", str(state), "nodes", "-o", "json")
    assert status == 1 and out == ""
    assert "UNAVAILABLE" in err


async def test_bench_spreads_over_the_replicas_it_is_given(
    gantry: Harness, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replicas = f"{dead_address()},{gantry.address}"
    status, out, _ = await run_cli(
        capsys,
        *("--address", replicas, "--state-dir", str(state), "bench"),
        *("--capability", "nothing-bound", "--requests", "9", "--concurrency", "3", "--json"),
    )
    report = json.loads(out)
    assert status == 0
    # Every call reached the live control plane (which knows no such capability); none was
    # lost to the dead address.
    assert report["requests"] == 9 and report["errors"] == {"NOT_FOUND/NOT_FOUND": 9}

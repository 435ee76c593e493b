"""`gantry bench` against a real in-process Gantry serving a tiny model: the JSON it prints counts
exactly the calls it made, failures are counted by reason, and an unreachable address exits 1."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gantry.cli.main import main as gantry_cli
from gantry.v1 import control_plane_pb2 as cp
from tests.integration.harness import Harness, running_gantry


@pytest.fixture
async def gantry(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        yield harness


@pytest.fixture
async def serving(gantry: Harness, tiny_model_dir: Path) -> str:
    """The tiny model READY as capability `tiny`; its deployment id."""
    await gantry.start_worker(await gantry.register_node("bench-node"))
    artifact = await gantry.register_model(tiny_model_dir, "tiny")
    deployment = await gantry.deploy(artifact.artifact_set_id, "tiny")
    await gantry.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)
    return deployment.deployment_id


def _state_with_client_key(harness: Harness, directory: Path) -> Path:
    directory.mkdir(exist_ok=True)
    (directory / "client.key").write_text(harness.api_key + "\n")
    return directory


async def _bench(
    harness: Harness, state: Path, capsys: pytest.CaptureFixture[str], *arguments: str
) -> tuple[int, dict[str, Any]]:
    argv = ["--address", harness.address, "--state-dir", str(state), "bench", *arguments, "--json"]
    capsys.readouterr()
    # The CLI runs its own event loop; the servers share this one, so it runs in a thread.
    status = await asyncio.to_thread(gantry_cli, argv)
    return status, json.loads(capsys.readouterr().out)


async def test_bench_counts_every_call_it_made_against_a_served_capability(
    gantry: Harness, serving: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state_with_client_key(gantry, tmp_path / "state")
    status, report = await _bench(
        gantry,
        state,
        capsys,
        "--capability",
        "tiny",
        "--requests",
        "12",
        "--concurrency",
        "3",
        "--inputs-per-request",
        "2",
        "--input-chars",
        "40",
        "--warmup",
        "2",
        "--priority",
        "batch",
    )
    assert status == 0
    assert report["method"] == "Embed"
    assert report["target"] == {"capability": "tiny"}
    assert report["requests"] == report["ok"] == 12  # the 2 warm-up calls are not counted
    assert report["errors"] == {}
    latency = report["latency_ms"]
    assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
    assert report["requests_per_s"] > 0
    assert report["inputs_per_s"] == pytest.approx(2 * report["requests_per_s"], rel=1e-3)


async def test_bench_texts_past_the_model_token_limit_are_cut_not_refused(
    gantry: Harness, serving: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2,000 characters are far past the tiny model's 128 tokens: bench asks to truncate, so it
    # measures what it always measured instead of counting INPUT_TOO_LONG.
    state = _state_with_client_key(gantry, tmp_path / "state")
    status, report = await _bench(
        gantry, state, capsys, "--capability", "tiny", "--requests", "3", "--input-chars", "2000"
    )
    assert status == 0
    assert report["requests"] == report["ok"] == 3 and report["errors"] == {}


async def test_bench_by_deployment_for_a_duration_with_packed_vectors(
    gantry: Harness, serving: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state_with_client_key(gantry, tmp_path / "state")
    status, report = await _bench(
        gantry,
        state,
        capsys,
        "--deployment",
        serving,
        "--duration",
        "0.5",
        "--concurrency",
        "2",
        "--encoding",
        "bytes",
    )
    assert status == 0
    assert report["target"] == {"deployment_id": serving}
    assert report["plan"]["duration_s"] == 0.5
    assert report["requests"] == report["ok"] >= 1
    assert report["elapsed_s"] >= 0.5


async def test_bench_of_an_unbound_capability_counts_not_found_by_reason(
    gantry: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state_with_client_key(gantry, tmp_path / "state")
    status, report = await _bench(
        gantry,
        state,
        capsys,
        "--capability",
        "nothing-bound",
        "--requests",
        "7",
        "--concurrency",
        "2",
    )
    assert status == 0  # the run completed; its errors are the measurement
    assert report["requests"] == 7
    assert report["ok"] == 0
    assert report["errors"] == {"NOT_FOUND/NOT_FOUND": 7}
    assert report["latency_ms"]["p50"] is None


async def test_bench_with_an_unknown_tenant_key_counts_unauthenticated(
    gantry: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state_with_client_key(gantry, tmp_path / "state")
    stranger = tmp_path / "stranger.key"
    stranger.write_text("gk_client_nobody_notasecret\n")
    status, report = await _bench(
        gantry,
        state,
        capsys,
        "--capability",
        "tiny",
        "--requests",
        "3",
        "--key-file",
        str(stranger),
    )
    assert status == 0
    assert report["ok"] == 0
    assert list(report["errors"]) == ["UNAUTHENTICATED/UNAUTHENTICATED"]
    assert report["errors"]["UNAUTHENTICATED/UNAUTHENTICATED"] == 3


async def test_bench_prints_a_human_report_with_errors_by_reason(
    gantry: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state_with_client_key(gantry, tmp_path / "state")
    argv = ["--address", gantry.address, "--state-dir", str(state), "bench"]
    argv += ["--capability", "nothing-bound", "--requests", "4"]
    assert await asyncio.to_thread(gantry_cli, argv) == 0
    printed = capsys.readouterr().out
    assert "requests    4 (ok 0, errors 4)" in printed
    assert "NOT_FOUND/NOT_FOUND  4" in printed
    assert "p50 -" in printed


def test_bench_against_nothing_listening_exits_1_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    state = tmp_path / "state"
    state.mkdir()
    (state / "client.key").write_text("gk_client_x_y\n")
    argv = ["--address", address, "--state-dir", str(state), "bench", "--capability", "tiny"]
    assert gantry_cli([*argv, "--connect-timeout", "0.3"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"cannot reach the control plane at {address}" in captured.err
    assert "no call was made" in captured.err

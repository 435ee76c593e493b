"""`gantry embed` against the real in-process control plane and scheduler (SQLite and PostgreSQL),
two scripted workers answering invokes: a large `--lines` file is split into calls of at most
MAX_INPUTS texts with every vector printed in input order, and `--file -` reads standard input in
a real child process."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gantry.cli.main import main as gantry_cli
from gantry.common.clock import ManualClock
from gantry.common.inference_limits import MAX_INPUTS
from tests.integration.harness import Harness
from tests.integration.pipeline_support import Pipeline, make_model_dir, pipeline_of, two_replicas
from tests.integration.scripted_worker import ScriptedWorker

GANTRY = Path(sys.executable).with_name("gantry")  # the installed entry point


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path) -> AsyncIterator[Pipeline]:
    async for pipeline in pipeline_of(
        database_url, tmp_path, make_model_dir(tmp_path), clock=ManualClock()
    ):
        yield pipeline


@pytest.fixture
async def workers(gantry: Pipeline) -> list[ScriptedWorker]:
    """Both replicas' workers, answering `line N` with a vector of N (any other text: -1)."""
    _, by_name = await two_replicas(gantry)
    for worker in by_name.values():
        worker.embed_value = lambda text: float(text.split()[1]) if text.startswith("line ") else -1
    return list(by_name.values())


def client_argv(harness: Harness, tmp_path: Path) -> list[str]:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / "client.key").write_text(harness.api_key + "\n")
    return ["--address", harness.address, "--state-dir", str(state)]


def embedded_inputs(workers: list[ScriptedWorker]) -> list[list[str]]:
    return [list(invoke.embed.inputs) for worker in workers for invoke in worker.answered_invokes]


async def test_a_2500_line_file_is_embedded_in_three_calls_printed_in_order(
    gantry: Pipeline,
    workers: list[ScriptedWorker],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = [f"line {index}" for index in range(2500)]
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(lines[:1000]) + "\n\n" + "\n".join(lines[1000:]) + "\n")
    argv = [*client_argv(gantry.harness, tmp_path), "embed", "--capability", "minilm"]
    capsys.readouterr()
    # The CLI is synchronous; the servers share this event loop, so it runs in a thread.
    status = await asyncio.to_thread(gantry_cli, [*argv, "--file", str(texts), "--lines", "--json"])
    assert status == 0
    document = json.loads(capsys.readouterr().out)
    assert [call["vectors"] for call in document["calls"]] == [MAX_INPUTS, MAX_INPUTS, 452]
    assert document["vectors"] == [[float(index)] * 4 for index in range(2500)]
    calls = embedded_inputs(workers)
    assert sorted(len(inputs) for inputs in calls) == [452, MAX_INPUTS, MAX_INPUTS]
    assert sorted(text for inputs in calls for text in inputs) == sorted(lines)

    status = await asyncio.to_thread(gantry_cli, [*argv, "--file", str(texts), "--lines"])
    assert status == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].endswith(" in 3 calls")
    assert printed[0].startswith("2500 vector(s), dim 4, deployment ")
    assert printed[1] == "[0] 'line 0': [+0.0000, +0.0000, +0.0000, +0.0000]"
    assert printed[-1] == "[2499] 'line 2499': [+2499.0000, +2499.0000, +2499.0000, +2499.0000]"


async def test_standard_input_is_read_by_file_dash_after_the_arguments(
    gantry: Pipeline, workers: list[ScriptedWorker], tmp_path: Path
) -> None:
    argv = [*client_argv(gantry.harness, tmp_path), "embed", "--capability", "minilm", "--json"]
    child = await asyncio.create_subprocess_exec(
        str(GANTRY),
        *argv,
        "line 7",
        "--file",
        "-",
        "--lines",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(b"line 3\n\nline 5\r\n"), timeout=60)
    assert child.returncode == 0, err.decode()
    document = json.loads(out)
    assert document["vectors"] == [[7.0] * 4, [3.0] * 4, [5.0] * 4]
    assert embedded_inputs(workers) == [["line 7", "line 3", "line 5"]]


async def test_truncate_is_asked_only_by_the_flag_and_a_split_call_failure_names_its_texts(
    gantry: Pipeline,
    workers: list[ScriptedWorker],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [*client_argv(gantry.harness, tmp_path), "embed", "--capability", "minilm", "--json"]
    for flags, asked in (([], False), (["--truncate"], True)):
        status = await asyncio.to_thread(gantry_cli, [*argv, *flags, "line 1"])
        assert status == 0
        invoke = [i for worker in workers for i in worker.answered_invokes][-1]
        assert (list(invoke.embed.inputs), invoke.embed.truncate) == (["line 1"], asked)

    # The second call holds text 1024 alone, an empty string: refused, and the note maps its
    # inputs[0] back to the whole input's text 1024.
    texts = [f"line {index}" for index in range(MAX_INPUTS)] + [""]
    capsys.readouterr()
    status = await asyncio.to_thread(gantry_cli, [*argv, *texts])
    assert status == 1
    err = capsys.readouterr().err
    assert f"note: call 2 of 2 failed; it held texts {MAX_INPUTS}..{MAX_INPUTS}" in err
    assert "error: INVALID_ARGUMENT EMPTY_INPUT: inputs[0] is an empty string" in err

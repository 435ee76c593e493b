"""`gantry generate` against the real in-process control plane and scheduler and a scripted worker
stream: the text reaches the terminal chunk by chunk as the worker produces it (a real child
process, read while the worker still holds the rest), Ctrl-C cancels the generation on the worker
and exits 130 without a traceback, `--no-stream --chat --system -o json` sends a chat as asked and
prints one JSON object, and a refusal prints its reason and field."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gantry.cli.main import main as gantry_cli
from tests.integration.generation_support import (
    generated,
    progress,
    scripted_generation,
    settled,
)
from tests.integration.harness import CTRL_C_REACHES_IT, Harness
from tests.integration.scripted_worker import ScriptedWorker

GANTRY = Path(sys.executable).with_name("gantry")  # the installed entry point


@pytest.fixture
async def serving(
    sqlite_url: str, tmp_path: Path, tiny_model_dir: Path
) -> AsyncIterator[tuple[Harness, ScriptedWorker]]:
    async for pair in scripted_generation(sqlite_url, tmp_path, tiny_model_dir):
        yield pair


def client_argv(harness: Harness, tmp_path: Path) -> list[str]:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / "client.key").write_text(harness.api_key + "\n")
    return ["--address", harness.address, "--state-dir", str(state)]


async def _child(argv: list[str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *CTRL_C_REACHES_IT,
        str(GANTRY),
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _read_exactly(child: asyncio.subprocess.Process, text: str) -> None:
    assert child.stdout is not None
    printed = await asyncio.wait_for(child.stdout.readexactly(len(text.encode())), 30)
    assert printed.decode() == text


async def test_the_text_reaches_the_terminal_as_it_is_produced(
    serving: tuple[Harness, ScriptedWorker], tmp_path: Path
):
    harness, worker = serving
    argv = [*client_argv(harness, tmp_path), "generate", "Once", "--capability", "tiny"]
    child = await _child(argv)
    invoke = await asyncio.wait_for(worker.invokes.get(), timeout=30)
    assert invoke.generate.prompt == "Once" and invoke.generate.stream
    # Each piece is on the terminal before the worker has produced the next.
    worker.send(progress(invoke.request_id, " upon", 1))
    await _read_exactly(child, " upon")
    worker.send(progress(invoke.request_id, " a time", 3))
    await _read_exactly(child, " a time")
    worker.send(generated(invoke.request_id, " upon a time", tokens=3))
    out, err = await asyncio.wait_for(child.communicate(), 30)
    assert child.returncode == 0, err.decode()
    assert out.decode() == "\n"  # the rest of stdout: the text alone, then a newline
    summary = err.decode().strip()
    assert summary.startswith(
        f"STOP: 3 prompt + 3 generated tokens, deployment {worker.deployment_id} on node "
    )


async def test_ctrl_c_cancels_the_generation_on_the_worker_and_exits_130(
    serving: tuple[Harness, ScriptedWorker], tmp_path: Path
):
    harness, worker = serving
    argv = [*client_argv(harness, tmp_path), "generate", "Tell me", "--capability", "tiny"]
    child = await _child(argv)
    invoke = await asyncio.wait_for(worker.invokes.get(), timeout=30)
    worker.send(progress(invoke.request_id, "Once", 1))
    await _read_exactly(child, "Once")
    child.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(child.communicate(), 30)
    assert child.returncode == 130
    assert "Traceback" not in err.decode() and "cancelled" in err.decode()
    assert out.decode() == ""  # nothing after the text it had printed
    cancel = await asyncio.wait_for(worker.cancels.get(), timeout=10)
    assert cancel.request_id == invoke.request_id
    await settled(harness, "one CANCELLED WorkFinished", cancelled_total=1, infra_failures_total=0)


async def test_no_stream_sends_the_chat_as_asked_and_prints_one_json_object(
    serving: tuple[Harness, ScriptedWorker],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
):
    harness, worker = serving
    argv = [
        *client_argv(harness, tmp_path),
        *("generate", "Hi", "--capability", "tiny", "--no-stream", "-o", "json"),
        *("--system", "Be brief.", "--max-tokens", "7", "--stop", "\n", "--stop", "END"),
        *("--temperature", "0.5", "--top-p", "0.9", "--top-k", "40", "--seed", "11"),
    ]
    capsys.readouterr()
    # The CLI is synchronous; the servers share this event loop, so it runs in a thread.
    status = asyncio.create_task(asyncio.to_thread(gantry_cli, argv))
    invoke = await asyncio.wait_for(worker.invokes.get(), timeout=30)
    payload = invoke.generate
    assert not payload.stream and not payload.prompt
    assert [(m.role, m.content) for m in payload.messages] == [
        ("system", "Be brief."),
        ("user", "Hi"),
    ]
    assert payload.max_tokens == 7 and list(payload.stop) == ["\n", "END"]
    assert (payload.sampling.top_k, payload.sampling.seed) == (40, 11)
    assert payload.sampling.temperature == pytest.approx(0.5)
    assert payload.sampling.top_p == pytest.approx(0.9)
    worker.send(generated(invoke.request_id, "Hello.", tokens=2, prompt_tokens=9))
    assert await asyncio.wait_for(status, 30) == 0
    document = json.loads(capsys.readouterr().out)
    assert document == {
        "text": "Hello.",
        "finish_reason": "FINISH_REASON_STOP",
        "prompt_tokens": 9,
        "completion_tokens": 2,
        "deployment_id": worker.deployment_id,
        "node_id": document["node_id"],
    }
    assert document["node_id"]


async def test_a_refusal_prints_its_reason_and_field_and_exits_1(
    serving: tuple[Harness, ScriptedWorker],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
):
    harness, worker = serving
    argv = [*client_argv(harness, tmp_path), "generate", "Hi", "--capability", "tiny"]
    capsys.readouterr()
    status = await asyncio.to_thread(gantry_cli, [*argv, "--temperature", "3"])
    assert status == 1
    err = capsys.readouterr().err
    assert err == (
        "error: INVALID_ARGUMENT: sampling.temperature is 3; it must be a number from 0 to 2\n"
    )
    assert worker.invokes.empty()

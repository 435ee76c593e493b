"""The shell blocks of README.md and of every page under docs/ run as pasted against a real
`gantry up`.

One `gantry up` (a child process on free ports, its own state directory) serves every block. Each
fenced `sh`/`bash` block runs in bash (`-e -o pipefail`) in order, README.md's first, then each
docs/ page's (sorted by path), from a directory laid out like the repository root: `.venv`,
`.venv-llama` and `.venv-clients` (links to this checkout's) and `.gantry` (the instance's state),
so `.venv/bin/gantry`, `$(cat .gantry/operator.token)` and the like work unchanged; only the
control plane's default addresses are rewritten to the instance's (and GANTRY_ADDRESS /
GANTRY_STATE_DIR point at it too). `.venv/bin` is not on the blocks' PATH, as it is not after
`make run`: a bare `gantry` fails. A block that cannot run as pasted (it starts the services
itself, runs until Ctrl-C, needs a model that is not bundled, has ids to fill in) carries a
visible marker on the line before its fence:

    <!-- readme-test: skip (why) -->

Every other block must exit 0, and print what an `expect (a, b)` marker in the same place names.
Whatever a block leaves running (a worker or a server it started with `&`) is killed with its
process group when the block ends, pass or fail. The static test below needs no `gantry up` and
reads every file: every skip says why, no runnable block holds a `<PLACEHOLDER>` (a block with ids
to fill in either captures them in shell or is skipped), and no block, skipped or not, calls a
bare `gantry`. Titles name the file and the line of the block's opening fence.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from gantry.common.auth import auth_metadata
from gantry.v1 import inference_pb2, inference_pb2_grpc
from gantry.worker.model_host.environments import ENV_MAP_JSON
from tests.fixtures.clients_env import clients_python  # noqa: F401  (fixture)
from tests.fixtures.llama_env import llama_python  # noqa: F401  (fixture)
from tests.integration.polling import wait_until_sync

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
DEFAULT_ADDRESSES = ("127.0.0.1:50051", "localhost:50051")
# The OpenAI-compatible HTTP API's default address: each run takes a free port instead, so a run
# never collides with a `make run` or another run on this machine.
DEFAULT_HTTP_ADDRESSES = ("127.0.0.1:8080", "localhost:8080")
SKIP = re.compile(r"^<!--\s*readme-test:\s*skip\s*\((?P<why>.+)\)\s*-->\s*$")
# What a block that runs must print (comma-separated), e.g. the reason of a failure it shows.
EXPECT = re.compile(r"^<!--\s*readme-test:\s*expect\s*\((?P<what>.+)\)\s*-->\s*$")
FENCE = re.compile(r"^```(?P<info>[\w+-]*)\s*$")
PLACEHOLDER = re.compile(r"<[A-Z][A-Z_]+>")
# `gantry` as a command (not `.venv/bin/gantry`): not on PATH after `make run`. Comments are cut
# off first, so prose that names the CLI is no command.
BARE_GANTRY = re.compile(r"(?:^|[\s;&|(`'\"])gantry(?=\s|$)")
COMMENT = re.compile(r"(?:^|\s)#.*$")
RUN_LANGUAGES = {"sh", "bash", "shell"}
READY_TIMEOUT_S = 240.0
# The media walkthrough builds three tiny models and walks each through every gate in one block.
BLOCK_TIMEOUT_S = 300.0


def doc_files() -> list[Path]:
    """README.md, then every Markdown page under docs/ (docs/api, generated from the protos,
    included), sorted by path."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def _source(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    skip: str | None  # the reason, when marked
    expect: tuple[str, ...] = ()  # what its output must hold
    source: str = "README.md"  # the file, relative to the repository root

    @property
    def title(self) -> str:
        first = next((s for s in self.text.splitlines() if s.strip()), "")
        return f"{self.source}:{self.line} {first.strip()[:60]}"


def readme_blocks(text: str, source: str = "README.md") -> list[Block]:
    """Every fenced block in order, with the skip marker (if any) on the line before it."""
    blocks: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        end = next(
            (j for j in range(index + 1, len(lines)) if lines[j].startswith("```")), len(lines)
        )
        previous = next((lines[j] for j in range(index - 1, -1, -1) if lines[j].strip()), "")
        marker = SKIP.match(previous.strip())
        expected = EXPECT.match(previous.strip())
        blocks.append(
            Block(
                line=index + 1,
                language=fence.group("info").lower(),
                text="\n".join(lines[index + 1 : end]) + "\n",
                skip=marker.group("why").strip() if marker else None,
                expect=tuple(
                    part.strip() for part in expected.group("what").split(",") if part.strip()
                )
                if expected
                else (),
                source=source,
            )
        )
        index = end + 1
    return blocks


def shell_blocks(text: str, source: str = "README.md") -> list[Block]:
    return [b for b in readme_blocks(text, source) if b.language in RUN_LANGUAGES]


def static_problems(text: str, source: str = "README.md") -> list[str]:
    problems = []
    for block in shell_blocks(text, source):
        for offset, line in enumerate(block.text.splitlines(), 1):
            if BARE_GANTRY.search(COMMENT.sub("", line)):
                problems.append(
                    f"{source}:{block.line + offset}: a bare `gantry` (not on PATH after "
                    "`make run`): write .venv/bin/gantry"
                )
        if block.skip is not None:
            continue
        if found := sorted(set(PLACEHOLDER.findall(block.text))):
            problems.append(f"{block.title}: placeholders {' '.join(found)} in a block that runs")
    for number, line in enumerate(text.splitlines(), 1):
        marker = line.strip()
        if "readme-test:" in line and not (SKIP.match(marker) or EXPECT.match(marker)):
            problems.append(f"{source}:{number}: malformed marker (want: skip (reason))")
    return problems


@pytest.mark.parametrize("path", doc_files(), ids=_source)
def test_static_blocks_are_runnable_or_skipped_with_a_reason(path: Path) -> None:
    assert static_problems(path.read_text(), _source(path)) == []


def test_static_reads_readme_and_every_docs_page() -> None:
    sources = [_source(path) for path in doc_files()]
    assert sources[0] == "README.md"
    assert {"docs/operations/guide.md", "docs/kserve.md", "docs/api/README.md"} <= set(sources)


def test_the_static_check_can_fail() -> None:
    bad = (
        "```sh\ngantry unload <DEPLOYMENT_ID>\n```\n"
        "<!-- readme-test: skip -->\n```sh\nmake run\n```\n"
        "<!-- readme-test: skip (starts the services) -->\n```sh\nmake run <X_Y>\n```\n"
        "```sh\n.venv/bin/gantry nodes  # the gantry CLI\nX=$(gantry nodes -o json)\n```\n"
    )
    assert static_problems(bad, "docs/x.md") == [
        "docs/x.md:2: a bare `gantry` (not on PATH after `make run`): write .venv/bin/gantry",
        "docs/x.md:1 gantry unload <DEPLOYMENT_ID>: placeholders <DEPLOYMENT_ID> in a block "
        "that runs",
        "docs/x.md:14: a bare `gantry` (not on PATH after `make run`): write .venv/bin/gantry",
        "docs/x.md:4: malformed marker (want: skip (reason))",
    ]
    blocks = shell_blocks(bad, "docs/x.md")
    assert [b.skip for b in blocks] == [None, None, "starts the services", None]
    assert blocks[0].title == "docs/x.md:1 gantry unload <DEPLOYMENT_ID>"


# ---- the real run -------------------------------------------------------------------------------


def _free_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@dataclass(frozen=True)
class Instance:
    root: Path  # laid out like the repository root: .venv, .gantry
    address: str
    http_address: str
    log: Path


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_serving(process: subprocess.Popen[bytes], instance: Instance) -> None:
    """Until an Embed of the bundled model answers (what `gantry up` prints as ready)."""
    key = instance.root / ".gantry" / "client.key"
    request = inference_pb2.EmbedRequest(capability="minilm", inputs=["ready?"])
    with grpc.insecure_channel(instance.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)

        def serving() -> bool:
            if process.poll() is not None:
                pytest.fail(f"gantry up exited {process.returncode}:\n{_tail(instance.log)}")
            if not key.exists():
                return False
            try:
                stub.Embed(request, metadata=auth_metadata(key.read_text().strip()), timeout=30)
            except grpc.RpcError:
                return False  # not deployed yet
            return True

        # Each try is a call `gantry up` serves: every half second is often enough.
        wait_until_sync(
            serving,
            READY_TIMEOUT_S,
            "gantry up to serve an Embed",
            interval_s=0.5,
            last=lambda: "\n" + _tail(instance.log),
        )


@pytest.fixture(scope="module")
def gantry_up(
    tmp_path_factory: pytest.TempPathFactory,
    vision_python: str,
    llama_python: str,  # noqa: F811
    clients_python: str,  # noqa: F811
) -> Iterator[Instance]:
    root = tmp_path_factory.mktemp("readme")
    (root / ".venv").symlink_to(REPO / ".venv")
    # The adopted-endpoint blocks start llama.cpp's server from it, outside Gantry.
    (root / ".venv-llama").symlink_to(Path(llama_python).parents[1])
    # The standard-protocol blocks run tritonclient from it (its protobuf<7 pin keeps it apart).
    (root / ".venv-clients").symlink_to(Path(clients_python).parents[1])
    (root / "scripts").symlink_to(REPO / "scripts")  # tiny_models.py, sample_media.py
    instance = Instance(
        root=root,
        address=_free_address(),
        http_address=_free_address(),
        log=root / "gantry-up.log",
    )
    with instance.log.open("wb") as log:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "gantry.cli.main"),
                *("--state-dir", str(root / ".gantry"), "--address", instance.address),
                *("up", "--scheduler-address", _free_address(), "--no-metrics"),
                *("--http-address", instance.http_address),
            ],
            cwd=root,
            # As `make run` does: the image adapters' environment mapped as "vision", llama.cpp's
            # server's as "llama".
            env={
                **os.environ,
                ENV_MAP_JSON: json.dumps({"vision": vision_python, "llama": llama_python}),
            },
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own group: the teardown ends everything it started
        )
    try:
        _wait_serving(process, instance)
        yield instance
    finally:
        process.send_signal(signal.SIGTERM)  # `gantry up` stops its children in order
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _rewritten(block: Block, instance: Instance) -> str:
    text = block.text
    for default in DEFAULT_ADDRESSES:
        text = text.replace(default, instance.address)
    for default in DEFAULT_HTTP_ADDRESSES:
        text = text.replace(default, instance.http_address)
    return text


def _run_block(
    block: Block, instance: Instance, env: dict[str, str]
) -> subprocess.CompletedProcess[str] | None:
    """Run one block in its own session; whatever it left running (a worker it started in the
    background) is ended with it, so a failing block leaks no process. None: it timed out."""
    process = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", _rewritten(block, instance)],
        cwd=instance.root,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _blocks_env(instance: Instance) -> dict[str, str]:
    """The environment blocks run in: the instance's address and state, and the PATH of a shell
    after `make run`, which does not hold .venv/bin (a bare `gantry` is not found)."""
    venv_bin = (REPO / ".venv" / "bin").resolve()
    path = [
        entry
        for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and Path(entry).resolve() != venv_bin
    ]
    return {
        **os.environ,
        "GANTRY_ADDRESS": instance.address,
        "GANTRY_STATE_DIR": str(instance.root / ".gantry"),
        "PATH": os.pathsep.join(path),
    }


def _logs_written_since(instance: Instance, started: float) -> str:
    """The tails of the logs written while a failed block ran (`gantry up`'s, its services' and
    workers' in .gantry/logs, a server a block started there): what the services saw, since a
    block's own output rarely says why they answered as they did."""
    since = time.time() - (time.monotonic() - started)
    logs = [instance.log, *sorted((instance.root / ".gantry" / "logs").glob("*.log"))]
    written = [log for log in logs if log.exists() and log.stat().st_mtime >= since]
    return "".join(f"\n----- {log.name} (tail) -----\n{_tail(log, 30)}" for log in written)


def _run_blocks(blocks: list[Block], instance: Instance) -> list[str]:
    """Run each block that is not skipped, in order; the failures, each with its output's tail."""
    env = _blocks_env(instance)
    failures, skipped, ran = [], [], []
    for block in blocks:
        if block.skip is not None:
            skipped.append(f"{block.title}: {block.skip}")
            continue
        started = time.monotonic()
        outcome = _run_block(block, instance, env)
        if outcome is None:
            failures.append(f"{block.title}: still running after {BLOCK_TIMEOUT_S:g}s")
            continue
        done = outcome
        # Each block's time, printed with -s: where the walkthrough's minutes go.
        ran.append(f"{block.title} ({time.monotonic() - started:.1f} s)")
        output = done.stdout + done.stderr
        if done.returncode != 0:
            failures.append(
                f"{block.title}: exit {done.returncode}\n{output[-2000:]}"
                + _logs_written_since(instance, started)
            )
        elif missing := [text for text in block.expect if text not in output]:
            failures.append(
                f"{block.title}: printed none of {missing}\n{output[-2000:]}"
                + _logs_written_since(instance, started)
            )
    print("ran:", *ran, "skipped:", *skipped, sep="\n  ")
    assert ran, "no block ran"
    return failures


# Every README block in one test: the suite's 120 s per test would cut it off mid-walkthrough (the
# media block alone builds and walks three models, the text generation block one more); each
# block keeps its own BLOCK_TIMEOUT_S.
@pytest.mark.timeout(1500)
@pytest.mark.e2e
def test_readme_shell_blocks_run_against_gantry_up(gantry_up: Instance) -> None:
    failures = _run_blocks(shell_blocks(README.read_text()), gantry_up)
    assert failures == [], "\n\n".join(failures)


# Then docs/'s blocks, on the same `gantry up` (the module's fixture), each page in path order.
# Each is small (a command or a few); together well under a minute.
@pytest.mark.timeout(600)
@pytest.mark.e2e
def test_docs_shell_blocks_run_against_gantry_up(gantry_up: Instance) -> None:
    blocks = [
        block for path in doc_files()[1:] for block in shell_blocks(path.read_text(), _source(path))
    ]
    failures = _run_blocks(blocks, gantry_up)
    assert failures == [], "\n\n".join(failures)

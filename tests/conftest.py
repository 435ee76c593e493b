"""Test-wide settings: everything offline, ML libraries quiet; the stores each test gets.

`make test` runs the suite on two pytest-xdist workers with `--dist loadfile`, so what a test
creates must not collide with another worker's. Each database here is a fresh one with a random
name, every file a test writes lives under its own tmp_path (a per-worker base under xdist), each
worker has its own warm pool (tests/integration/harness.py), and the servers listen on port 0.
Whole files go to one worker because some files look model hosts up machine-wide by a fixed
deployment id shared by their tests (tests/integration/test_model_host.py's "dep-embed",
test_worker_supervision.py's "dep-restart"), and because module-scoped fixtures (a Gantry with a
deployed model) are then built once per file rather than once per worker.

Files run longest first (`make test` passes `--no-loadscope-reorder`, so xdist hands files out in
collection order): with two workers, a two-minute file handed out last would run alone at the end.
tests/file_durations.json holds each file's seconds from a full run (rebuild it with
`scripts/file_durations.py`); a file it does not list is placed by its directory and test count.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import asyncio
import json
import secrets
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_timeout

# A test past its timeout is failed by pytest-timeout from its SIGALRM handler, which prints the
# threads' stacks: an async test (or fixture teardown) stuck on an await shows only its event
# loop's select. Every asyncio task's stack is printed first, so the await that never returned
# is named (a PostgreSQL teardown hung 120 s in two fresh-clone runs, with no other trace).
_timeout_sigalrm = pytest_timeout.timeout_sigalrm


def _awaiting(task: asyncio.Task[Any]) -> list[str]:
    """Where `task` waits, outermost first, through every coroutine it awaits (a task's own
    stack shows its outermost coroutine only)."""
    where: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = next(
            (
                f
                for name in ("cr_frame", "ag_frame", "gi_frame")
                if (f := getattr(awaited, name, None))
            ),
            None,
        )
        if frame is None:
            break
        where.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        awaited = next(
            (
                a
                for name in ("cr_await", "ag_await", "gi_yieldfrom")
                if (a := getattr(awaited, name, None))
            ),
            None,
        )
    return where


def _timeout_naming_tasks(item: pytest.Item, settings: Any) -> None:
    loop = asyncio._get_running_loop()
    if loop is not None:
        print(f"+++++ asyncio tasks of {item.nodeid} at its timeout +++++")
        for task in asyncio.all_tasks(loop):
            print(f"task {task.get_name()}:", *_awaiting(task), sep="\n  ")
    _timeout_sigalrm(item, settings)


pytest_timeout.timeout_sigalrm = _timeout_naming_tasks

POSTGRES_URL = os.environ.get(
    "GANTRY_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)


async def _postgres_admin():  # type: ignore[no-untyped-def]
    import asyncpg

    dsn = POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://")
    try:
        return await asyncpg.connect(dsn, timeout=5)
    except (OSError, asyncpg.PostgresError) as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and PostgreSQL at {POSTGRES_URL} is unreachable: {error}")
        pytest.skip(f"PostgreSQL at {POSTGRES_URL} is unreachable: {error}")


async def _fresh_postgres_database() -> AsyncIterator[str]:
    """A fresh, empty PostgreSQL database, dropped afterwards."""
    admin = await _postgres_admin()
    name = f"gantry_test_{secrets.token_hex(6)}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = POSTGRES_URL.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


_DURATIONS = Path(__file__).with_name("file_durations.json")
# Seconds a test of an unlisted file is assumed to take, by its top directory: a guess only
# orders the files; a wrong one costs time at the end of the run, never a result.
_SECONDS_PER_TEST = {"e2e": 30.0, "chaos": 10.0, "hostile": 6.0, "integration": 1.0, "unit": 0.03}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest file first; a file's own tests keep their order (module fixtures)."""
    known = json.loads(_DURATIONS.read_text()) if _DURATIONS.is_file() else {}
    counts: dict[str, int] = {}
    for item in items:
        counts[item.nodeid.split("::")[0]] = counts.get(item.nodeid.split("::")[0], 0) + 1

    def expected(path: str) -> float:
        if path in known:
            return float(known[path])
        parts = path.split("/")
        top = parts[1] if len(parts) > 2 else ""
        return counts[path] * _SECONDS_PER_TEST.get(top, 1.0)

    items.sort(key=lambda item: -expected(item.nodeid.split("::")[0]))


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    async for url in _fresh_postgres_database():
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / f'gantry-{uuid.uuid4().hex[:8]}.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """Both stores Gantry supports: the embedded default and the production one."""
    if request.param == "sqlite":
        yield request.getfixturevalue("sqlite_url")
    else:
        async for url in _fresh_postgres_database():
            yield url


from tests.fixtures.tiny_causal_lm import tiny_causal_lm_dir  # noqa: E402, F401
from tests.fixtures.tiny_model import (  # noqa: E402, F401  (shared fixtures)
    tiny_cross_encoder_dir,
    tiny_model_dir,
)
from tests.fixtures.tiny_siglip2 import tiny_siglip2_dir  # noqa: E402, F401
from tests.fixtures.tiny_trocr import tiny_trocr_dir  # noqa: E402, F401
from tests.fixtures.tiny_whisper import tiny_whisper_dir  # noqa: E402, F401
from tests.fixtures.vision_env import vision_python  # noqa: E402, F401

"""Fixtures of the chaos suite: one real-process Gantry per test, torn down to the last process."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Generator
from pathlib import Path

import pytest

from tests.chaos.cluster import Cluster


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed


_CALL_FAILED = pytest.StashKey[bool]()


@contextlib.asynccontextmanager
async def started(cluster: Cluster, request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    """`cluster` started, then stopped whatever happened, its logs printed if the test failed."""
    try:
        await cluster.start()
        yield cluster
    finally:
        if request.node.stash.get(_CALL_FAILED, True):
            cluster.print_logs_on_failure()
        await cluster.stop()


@pytest.fixture
async def cluster(
    postgres_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Cluster]:
    """Scheduler, control plane and one worker, started as `gantry up` starts them."""
    async with started(Cluster(database_url=postgres_url, root=tmp_path), request) as cluster:
        yield cluster

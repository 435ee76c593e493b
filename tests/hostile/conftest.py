"""Fixtures of the hostile suite: one real-process Gantry per test module (the chaos suite's
`Cluster`, with the HTTP door on), torn down to the last process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.hostile.stack import CAPABILITY, HostileStack
from tests.integration.module_databases import module_database

_CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> AsyncIterator[HostileStack]:
    """Scheduler, control plane (gRPC and HTTP doors) and one worker as `gantry up` starts them,
    on PostgreSQL, serving the tiny embedder as CAPABILITY to two tenants."""
    root = tmp_path_factory.mktemp("hostile")
    async with module_database("postgres", root) as database_url:
        stack = HostileStack(database_url=database_url, root=root)
        try:
            await stack.start()
            deployment_id = await stack.deploy_chunked(tiny_model_dir, CAPABILITY)
            await stack.wait_ready(deployment_id, timeout_s=120)
            await stack.both_doors_serve_the_victim()
        except BaseException:
            stack.print_logs_on_failure()
            await stack.stop()
            raise
        try:
            yield stack
        finally:
            await stack.stop()


@pytest.fixture(autouse=True)
def logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """A failed test prints the tail of each service's log (the stack outlives the test)."""
    yield
    if request.node.stash.get(_CALL_FAILED, False) and "stack" in request.fixturenames:
        request.getfixturevalue("stack").print_logs_on_failure()

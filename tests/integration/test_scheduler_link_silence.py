"""A stopped scheduler is noticed and answered typed (issue 26, item 7).

A real `gantry scheduler` process, stopped with SIGSTOP, keeps its socket open and answers nothing:
before, every request waited out its own deadline. The link must fail the request that waits and
refuse new ones with SCHEDULER_UNAVAILABLE once a ping goes unanswered, and take requests again on
its own after SIGCONT. Every wait is on the link's state, bounded only by a generous deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gantry.common import tokens
from gantry.common.errors import GantryError
from gantry.common.grpc_server import insecure_channel
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.controlplane.platform.scheduler_silence import Liveness
from gantry.v1 import scheduler_pb2
from tests.integration.polling import wait_until
from tests.integration.test_scheduler_link import one_residency_cluster
from tests.ports import free_port

TOKEN = tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler")
# Short, so the test is quick; the production default is in docs/limits.md.
SILENCE_TIMEOUT_S = 1.0
STATE_DEADLINE_S = 60.0


@dataclass
class SchedulerProcess:
    process: subprocess.Popen[bytes]
    address: str

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)


async def _wait_serving(address: str) -> None:
    async with insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        async def serving() -> bool:
            with contextlib.suppress(Exception):  # not listening yet
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
            return False

        await wait_until(serving, STATE_DEADLINE_S, "the scheduler process SERVING")


@pytest.fixture
def scheduler_process(tmp_path: Path) -> Iterator[SchedulerProcess]:
    token_file = tmp_path / "scheduler.token"
    token_file.write_text(TOKEN + "\n", encoding="utf-8")
    token_file.chmod(0o600)
    address = f"127.0.0.1:{free_port()}"
    argv = [sys.executable, "-m", "gantry.cli.main", "scheduler", "--listen", address]
    with open(tmp_path / "scheduler.log", "wb") as log:
        process = subprocess.Popen(
            [*argv, "--service-token-file", str(token_file)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield SchedulerProcess(process=process, address=address)
    finally:
        # A stopped process would not act on SIGTERM; SIGCONT first, then end it.
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
            process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _work(work_id: str) -> scheduler_pb2.WorkSubmitted:
    return scheduler_pb2.WorkSubmitted(work_id=work_id, deployment_id="d1", tenant_id="t1")


async def test_a_stopped_scheduler_fails_waiting_and_new_requests_typed_and_recovers_on_sigcont(
    scheduler_process: SchedulerProcess,
) -> None:
    await _wait_serving(scheduler_process.address)
    link = SchedulerLink(
        address=scheduler_process.address,
        service_token=TOKEN,
        cluster_state=one_residency_cluster(1),
        reconnect_max_seconds=0.5,
        silence_timeout_seconds=SILENCE_TIMEOUT_S,
    )
    link.start()
    try:
        await link.wait_connected(STATE_DEADLINE_S)
        first = await link.dispatch(_work("w-first"), timeout=STATE_DEADLINE_S)
        assert first.node_id == "n1"
        # The only slot is taken: this one waits in the scheduler's queue, legitimately.
        waiting = asyncio.create_task(link.dispatch(_work("w-waiting"), timeout=600))

        scheduler_process.signal(signal.SIGSTOP)
        with pytest.raises(GantryError) as failed:
            await waiting
        assert failed.value.reason == "SCHEDULER_UNAVAILABLE"
        assert "has not answered" in failed.value.message
        assert link.liveness is Liveness.SILENT and not link.connected
        # As the serving path does for a failed dispatch: the scheduler hears it when it wakes.
        link.work_finished("w-waiting", scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE)

        # A new request is refused at once, never queued behind the silence.
        with pytest.raises(GantryError) as refused:
            await link.dispatch(_work("w-refused"), timeout=600)
        assert refused.value.reason == "SCHEDULER_UNAVAILABLE"
        assert "has not answered" in refused.value.message

        scheduler_process.signal(signal.SIGCONT)
        await link.wait_connected(STATE_DEADLINE_S)
        assert link.liveness is Liveness.ANSWERING
        link.work_finished("w-first", scheduler_pb2.WORK_OUTCOME_SUCCESS)
        again = await link.dispatch(_work("w-again"), timeout=STATE_DEADLINE_S)
        assert again.node_id == "n1"
    finally:
        await link.stop()

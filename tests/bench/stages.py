"""Where one Embed's time goes: a per-stage breakdown from the spans every process writes.

Each process of `gantry up` (control plane, scheduler, worker agent, the model host child)
appends its spans to one JSON-lines file (GANTRY_TRACE_FILE, which they inherit). One trace per
call; the stages are the gaps between span boundaries plus what the client measured around the
control plane's span, so they add up to the client's time. All processes share this machine's
clock, so cross-process gaps are meaningful to tens of microseconds.

Runs in a `gantry up` of its own: writing spans to a file costs every call something, which the
other figures must not pay.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tests.waiting import NotInTime, poll

SPANS = ("controlplane.embed", "scheduler.dispatch", "worker.invoke", "model_host.embed")
# An uncontended Embed is admitted on the control plane's credits, with no scheduler hop (issue
# 29): its trace has no scheduler span, and its decision stage is nil.
OPTIONAL_SPANS = frozenset({"scheduler.dispatch"})
HOST_STAGE = "model host embed (the model)"


def _seconds(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _traces(path: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """trace id -> span name -> span, for traces that hold every span but the optional ones."""
    traces: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for line in path.read_text().splitlines():
        span = json.loads(line)
        if span["name"] in SPANS:
            traces[span["context"]["trace_id"]][span["name"]] = span
    required = set(SPANS) - OPTIONAL_SPANS
    return {tid: spans for tid, spans in traces.items() if required <= set(spans)}


def _started(spans: dict[str, dict[str, Any]]) -> float:
    return _seconds(spans["controlplane.embed"]["start_time"])


def stages_of(spans: dict[str, dict[str, Any]], client_seconds: float) -> dict[str, float]:
    """The stages of one call, in milliseconds; they sum to `client_seconds`."""
    cp, worker, host = (spans[name] for name in SPANS if name not in OPTIONAL_SPANS)
    cp_start, cp_end = _seconds(cp["start_time"]), _seconds(cp["end_time"])
    sched = spans.get("scheduler.dispatch")
    dispatched = _seconds(sched["start_time"]) if sched is not None else cp_start
    w_start, w_end = _seconds(worker["start_time"]), _seconds(worker["end_time"])
    h_start, h_end = _seconds(host["start_time"]), _seconds(host["end_time"])
    return {
        "client <-> control plane (gRPC, auth)": (client_seconds - (cp_end - cp_start)) * 1000,
        "control plane -> scheduler decision": (dispatched - cp_start) * 1000,
        "decision -> worker has the invoke": (w_start - dispatched) * 1000,
        "worker -> model host forward pass": (h_start - w_start) * 1000,
        HOST_STAGE: (h_end - h_start) * 1000,
        "model host -> worker": (w_end - h_end) * 1000,
        "worker -> control plane answer": (cp_end - w_end) * 1000,
    }


async def breakdown(
    call: Callable[[], Awaitable[object]], *, trace_file: Path, iterations: int, direct_ms: float
) -> dict[str, float]:
    """Print the stages' medians and return them, in ms ({}: no complete trace was written)."""
    for _ in range(10):  # warm-up, not measured
        await call()
    # The measured calls' traces are those that start from here (the spans' clock is this
    # machine's): the warm-up's, which the services export in batches every 0.5 s, need not be
    # written yet to be told apart.
    measured_from = time.time()
    client: list[float] = []
    for _ in range(iterations):
        started = time.perf_counter()
        await call()
        client.append(time.perf_counter() - started)
    traces: list[dict[str, dict[str, Any]]] = []

    def written() -> bool:
        nonlocal traces
        traces = sorted(
            (s for s in _traces(trace_file).values() if _started(s) >= measured_from),
            key=_started,
        )
        return len(traces) >= iterations

    # Whatever was written by then is reported (the breakdown says how many calls it holds).
    with contextlib.suppress(NotInTime):
        await poll(written, 10.0, "the measured calls' spans", interval_s=0.1)
    rows = [stages_of(spans, seconds) for spans, seconds in zip(traces, client, strict=False)]
    if not rows:
        print("  per-stage breakdown: no complete traces were written")
        return {}
    print(f"per-stage breakdown of one Embed, concurrency 1, medians of {len(rows)} calls:")
    total = statistics.median(client) * 1000
    medians = {stage: statistics.median(r[stage] for r in rows) for stage in rows[0]}
    for stage, ms in medians.items():
        print(f"  {stage:<44} {ms:8.2f} ms")
    print(
        f"  {'client total':<44} {total:8.2f} ms   direct encode (baseline) {direct_ms:.2f} ms, "
        f"overhead {total - direct_ms:.2f} ms"
    )
    return medians

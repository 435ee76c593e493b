"""One trial of the model host's CPU calibration (`cpu_calibration`), run as
`python -I -m gantry.worker.model_host.cpu_trial [--default-threads]` in a runtime environment's
interpreter with the OpenMP variables under trial already in its environment (libgomp reads them
once, when torch loads, so each wait policy needs a process of its own).

The work is a small transformer encoder shaped like the bundled all-MiniLM-L6-v2 (6 layers, 384
wide, one 16-token sentence): many short parallel regions with Python between them, which is
where a wait policy shows. For each thread count (torch's own and half of it, or only torch's own
with --default-threads) it prints one JSON line: the p50 of back-to-back
forward passes (what a caller waits) and the CPU the process spent per pass when passes come with
a gap between them (what spinning threads take from the processes that share the cores).
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from collections.abc import Iterator

WARMUP = 10
PASSES = 40
GAPPED_PASSES = 20
# Each loop also stops after this long (and after at least MIN_PASSES): on an oversubscribed
# node a spinning candidate can take a second a pass, and the trial must still end soon.
LOOP_BUDGET_S = 1.0
MIN_PASSES = 3
# About what the plane leaves between two forward passes of one host at low concurrency.
GAP_S = 0.002


def _passes(limit: int) -> Iterator[int]:
    """Up to `limit` passes, fewer when LOOP_BUDGET_S has run out (never fewer than MIN_PASSES)."""
    ends = time.perf_counter() + LOOP_BUDGET_S
    for index in range(limit):
        if index >= MIN_PASSES and time.perf_counter() > ends:
            return
        yield index


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(*, default_only: bool) -> None:
    import torch

    from gantry.worker.model_host.cpu_policy import thread_candidates

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        d_model=384, nhead=12, dim_feedforward=1536, batch_first=True
    )
    encoder = torch.nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False).eval()
    sentence = torch.randn(1, 16, 384)
    default_threads = torch.get_num_threads()
    counts = [default_threads] if default_only else thread_candidates(default_threads)
    samples: dict[int, list[float]] = {threads: [] for threads in counts}
    cpu_s = dict.fromkeys(counts, 0.0)
    gapped = dict.fromkeys(counts, 0)
    # The thread counts' forward passes take turns, so a busy stretch of a shared node weighs on
    # each alike rather than on whichever ran then.
    with torch.inference_mode():
        for _ in _passes(WARMUP):
            for threads in counts:
                torch.set_num_threads(threads)
                encoder(sentence)
        for _ in _passes(PASSES):
            for threads in counts:
                torch.set_num_threads(threads)
                started = time.perf_counter()
                encoder(sentence)
                samples[threads].append((time.perf_counter() - started) * 1000)
        # The CPU one after the other: a count's idle threads still spinning after its pass
        # would be charged to the next count's.
        for threads in counts:
            torch.set_num_threads(threads)
            before, gapped[threads] = _cpu_s(), 0
            for _ in _passes(GAPPED_PASSES):
                encoder(sentence)
                time.sleep(GAP_S)
                gapped[threads] += 1
            cpu_s[threads] = _cpu_s() - before
    for threads in counts:
        figures = {
            "threads": threads,
            "default_threads": default_threads,
            "p50_ms": statistics.median(samples[threads]),
            "cpu_ms": cpu_s[threads] * 1000 / gapped[threads],
        }
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main(default_only="--default-threads" in sys.argv[1:])

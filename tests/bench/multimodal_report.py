"""The figures of tests/bench/multimodal.py and how they are shown: a table of load and memory
per adapter and one of latency per request kind, each Gantry figure beside the direct run's from
the same run, and the rows `make bench`'s summary ends with."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gantry.cli.loadgen import percentile
from gantry.v1 import common_pb2
from tests.bench.summary import Summary

LOAD_TARGET_S = 1.0  # PERFORMANCE.md: a cold load in a child <= direct import + load + 1 s
MIB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class Case:
    adapter: str
    environment: str  # the worker's environment id: "default" or "vision"
    builder: tuple[str, str]  # module, function: the tiny fixture model's builder
    input_name: str  # what one request carries
    make_input: Callable[[], bytes]
    requests: tuple[str, ...]  # ModelHost methods (and the direct child's request kinds)


def same_output(kind: str, served: Any, direct: Any) -> str:
    """Whether the host answered what transformers did: "yes", or what differs."""
    if kind == "transcribe":
        return "yes" if served.text == direct else f"NO: {served.text!r} != {direct!r}"
    if kind == "recognize_text":
        return "yes" if list(served.texts) == direct else f"NO: {list(served.texts)} != {direct}"
    if kind == "embed_image":
        import numpy as np

        vector = np.frombuffer(served.float32_le, dtype="<f4").astype(np.float64)
        other = np.asarray(direct, dtype=np.float64)
        if vector.shape != other.shape:
            return f"NO: dim {vector.shape} != {other.shape}"
        cosine = float(vector @ other / (np.linalg.norm(vector) * np.linalg.norm(other)))
        return f"yes (cosine {cosine:.6f})" if cosine >= 0.9999 else f"NO: cosine {cosine:.6f}"
    if len(served.scores) != len(direct):
        return f"NO: {len(served.scores)} scores != {len(direct)}"
    worst = max(abs(a - b) for a, b in zip(served.scores, direct, strict=True))
    return f"yes (|diff| <= {worst:.1e})" if worst <= 1e-4 else f"NO: |diff| {worst:.1e}"


# -- figures ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Memory:
    rss_mib: float  # at ready: after the load and the first forward pass
    peak_mib: float  # VmHWM at ready
    peak_after_mib: float  # VmHWM after the timed requests


@dataclass(frozen=True, kw_only=True)
class Latency:
    kind: str
    gantry_ms: list[float]
    direct_ms: list[float]
    same: str


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def p99(samples: list[float]) -> float:
    return percentile(samples, 0.99)


@dataclass(frozen=True, kw_only=True)
class LoadParts:
    """A cold load's wall time, and where it went: before the model's stack is imported (the
    interpreter; for the host also Gantry's imports), importing it and loading the model (for the
    host also its sandbox), and the first forward pass (the host's health check; the direct
    run's first request)."""

    total_s: float
    before_s: float
    load_s: float
    first_s: float

    def parts(self) -> str:
        return f"{self.before_s:.2f} + {self.load_s:.2f} + {self.first_s:.2f}"


@dataclass(frozen=True, kw_only=True)
class Measured:
    case: Case
    gantry_load: LoadParts
    direct_load: LoadParts
    gantry: Memory
    direct: Memory
    latencies: list[Latency]
    isolation: str
    versions: dict[str, str]


@dataclass(frozen=True, kw_only=True)
class NotMeasured:
    case: Case
    why: str
    failed: bool  # a failure, not a piece that has not landed yet


def mib(measurement: common_pb2.Measurement) -> float:
    if measurement.WhichOneof("value") != "bytes":
        return float("nan")  # UNAVAILABLE: printed as nan, never a stand-in
    return measurement.bytes / MIB


def host_load(total_s: float, ready: Any, probe: Any) -> LoadParts:
    """The host's start in parts: its load_seconds runs from the load request (sandbox, the
    adapter's imports, the load, the health check), whose first forward pass the probe names."""
    return LoadParts(
        total_s=total_s,
        before_s=total_s - ready.load_seconds,
        load_s=ready.load_seconds - probe.first_invoke_seconds,
        first_s=probe.first_invoke_seconds,
    )


def direct_load(total_s: float, ready: dict[str, Any]) -> LoadParts:
    """The direct child's start in parts, from what it timed after its interpreter started."""
    imported, loaded, first = (float(ready[key]) for key in ("import_s", "load_s", "first_s"))
    return LoadParts(
        total_s=total_s,
        before_s=total_s - imported - loaded - first,
        load_s=imported + loaded,
        first_s=first,
    )


# -- report ----------------------------------------------------------------------------------------


def _mib_text(value: float) -> str:
    return "UNAVAILABLE" if math.isnan(value) else f"{value:.0f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    line = "  " + "  ".join(f"{{:<{width}}}" for width in widths)
    print(line.format(*headers))
    print(line.format(*("-" * width for width in widths)))
    for row in rows:
        print(line.format(*row))


def show(results: Sequence[Measured | NotMeasured]) -> None:
    print(
        "  load and memory. Load: Gantry's host spawned cold (ModelHost.start), the direct child "
        "from its spawn to its first answer; parts: before the stack's imports + imports and "
        "load + first forward pass. RSS at ready: after load and first pass; peak: VmHWM then, "
        "and after the timed requests"
    )
    load_rows = []
    for result in results:
        env = result.case.environment
        if isinstance(result, NotMeasured):
            load_rows.append([result.case.adapter, env, f"not measured: {result.why}", "", "", ""])
            continue
        cold, baseline = result.gantry_load, result.direct_load
        load_rows.append(
            [
                result.case.adapter,
                env,
                f"{cold.total_s:.2f} vs {baseline.total_s:.2f} s "
                f"(x{cold.total_s / baseline.total_s:.2f})",
                f"{cold.parts()} vs {baseline.parts()}",
                f"{result.gantry.rss_mib:.0f} vs {result.direct.rss_mib:.0f} MiB",
                f"{_mib_text(result.gantry.peak_mib)} vs {_mib_text(result.direct.peak_mib)} MiB "
                f"(after: {_mib_text(result.gantry.peak_after_mib)} vs "
                f"{_mib_text(result.direct.peak_after_mib)})",
            ]
        )
    _table(
        (
            "adapter",
            "env",
            "load gantry vs direct",
            "parts, s",
            "RSS at ready",
            "peak RSS (VmHWM)",
        ),
        load_rows,
    )
    print("  per request (in turns, after a warm-up)")
    rows = []
    for result in results:
        if isinstance(result, NotMeasured):
            continue
        for latency in result.latencies:
            g, d = latency.gantry_ms, latency.direct_ms
            rows.append(
                [
                    result.case.adapter,
                    latency.kind,
                    result.case.input_name,
                    f"{p50(g):.1f} vs {p50(d):.1f} ({p50(g) - p50(d):+.1f})",
                    f"{p99(g):.1f} vs {p99(d):.1f} ({p99(g) - p99(d):+.1f})",
                    str(len(g)),
                    latency.same,
                ]
            )
    if not rows:
        print("    none measured")
        return
    _table(
        (
            "adapter",
            "request",
            "input",
            "p50 ms gantry vs direct (+overhead)",
            "p99 ms",
            "n",
            "same output",
        ),
        rows,
    )
    for result in results:
        if isinstance(result, Measured):
            versions = ", ".join(f"{key} {value}" for key, value in result.versions.items())
            print(f"  {result.case.adapter}: host isolation {result.isolation}; {versions}")


def add_rows(summary: Summary, results: Sequence[Measured | NotMeasured]) -> None:
    for result in results:
        name = result.case.adapter.removeprefix("transformers_")
        if isinstance(result, NotMeasured):
            summary.add(f"cold load, {name}", "not measured", result.why, "-", None)
            continue
        summary.add(
            f"cold load, {name} (spawned host ready)",
            f"{result.gantry_load.total_s:.2f} s",
            f"direct import + load + first {result.direct_load.total_s:.2f} s",
            "<= direct + 1 s",
            result.gantry_load.total_s <= result.direct_load.total_s + LOAD_TARGET_S,
            f"in parts (before the stack's imports + imports and load + first forward pass) the "
            f"host took {result.gantry_load.parts()} s and the direct run "
            f"{result.direct_load.parts()} s: the host imports Gantry's modules first, enters "
            "its sandbox, and its first pass is its health check on its own probe input",
        )
        summary.add(
            f"peak RSS, {name}",
            f"{_mib_text(result.gantry.peak_mib)} MiB",
            f"direct {_mib_text(result.direct.peak_mib)} MiB",
            "-",
            None,
        )
        for latency in result.latencies:
            g, d = latency.gantry_ms, latency.direct_ms
            summary.add(
                f"{latency.kind} p50 / p99, one request",
                f"{p50(g):.1f} / {p99(g):.1f} ms",
                f"direct {p50(d):.1f} / {p99(d):.1f} ms",
                "-",
                None,
            )

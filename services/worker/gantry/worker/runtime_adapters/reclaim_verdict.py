"""The one rule for whether a stopped runtime's memory is proven back: a probe's child and a
serving resident's (LOAD failed, UNLOAD) are judged by it alike. Pure.

A process's host memory goes with it once it is reaped; its device memory does not have to (a
driver that has not torn the context down yet, a child it forked that still holds it). So a
runtime that ran on a GPU is reclaimed only when it was reaped AND NVML was read and no longer
lists its pid. NVML that cannot be read proves nothing on a GPU: the verdict is then unverified
(RECLAIM_UNVERIFIED), and the residency keeps its charge until a later check proves it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class ReclaimVerdict:
    verified: bool
    why: str  # one clause, for the reclaim's detail and RECLAIM_UNVERIFIED's message


def is_gpu_device(device: str) -> bool:
    """Whether a torch device string names a GPU ("cuda", "cuda:1"); "" and "cpu" do not."""
    return device == "cuda" or device.startswith("cuda:")


def reclaim_verdict(
    *, process_exited: bool, reaped: bool, on_gpu: bool, nvml_listed: bool | None
) -> ReclaimVerdict:
    """`on_gpu`: the runtime's device is a GPU, or NVML ever listed its pid. `nvml_listed`: the
    after-exit reading (None: NVML could not be read)."""
    if not (process_exited and reaped):
        return ReclaimVerdict(verified=False, why="the process was not confirmed exited and reaped")
    if nvml_listed is True:
        return ReclaimVerdict(verified=False, why="NVML still lists the pid")
    if nvml_listed is False:
        return ReclaimVerdict(verified=True, why="reaped, and NVML no longer lists the pid")
    if on_gpu:
        return ReclaimVerdict(
            verified=False, why="it ran on a GPU and NVML could not be read to prove it released"
        )
    return ReclaimVerdict(verified=True, why="reaped, and it never held device memory (CPU)")

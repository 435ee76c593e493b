"""What a runtime profile charges where placement counts memory. Pure.

The operator's estimate is a floor, a probe's measured peak refines it upwards: placement uses the
larger of the estimate and the measured peak, so an estimate that was too low never lets a model
in where its measured peak does not fit, and a generous estimate is never shrunk by a probe. A
measured VRAM peak is charged with a margin (`vram_with_margin`), RAM's as measured.
"""

from __future__ import annotations

from typing import Protocol

MIB = 1024 * 1024
# The margin a measured VRAM peak is charged with: 10% of it plus 256 MiB. The probe measures one
# worst-case pass once, after a fresh load. Serving adds what that sample does not hold: the
# caching allocator's fragmentation as request shapes vary over hours (blocks it cannot reuse for
# another shape, a few per cent of what it reserves), and kernels, cuBLAS/cuDNN workspaces and
# library buffers first touched by a shape or path the probe did not take (tens to a few hundred
# MiB whatever the model's size). The proportional part covers the first, the fixed part the
# second. Documented in docs/contracts.md ("A profile's envelope").
VRAM_MARGIN_FRACTION = 0.10
VRAM_MARGIN_BYTES = 256 * MIB


class ProfileMemory(Protocol):
    @property
    def ram_estimate_bytes(self) -> int: ...

    @property
    def vram_estimate_bytes(self) -> int: ...

    @property
    def ram_measured_peak_bytes(self) -> int | None: ...

    @property
    def vram_measured_peak_bytes(self) -> int | None: ...


def vram_with_margin(measured_peak: int) -> int:
    """What a measured VRAM peak charges: the peak, 10% of it, and 256 MiB."""
    return measured_peak + int(measured_peak * VRAM_MARGIN_FRACTION) + VRAM_MARGIN_BYTES


def profile_envelope(profile: ProfileMemory) -> tuple[int, int]:
    """(ram, vram) bytes: max(estimate, measured peak) for RAM, max(estimate, measured peak +
    margin) for VRAM. A VRAM of 0 is unknown: no estimate and nothing measured."""
    vram_measured = profile.vram_measured_peak_bytes
    return (
        max(profile.ram_estimate_bytes or 0, profile.ram_measured_peak_bytes or 0),
        max(
            profile.vram_estimate_bytes or 0,
            vram_with_margin(vram_measured) if vram_measured is not None else 0,
        ),
    )

"""What a runtime profile charges where placement counts memory. Pure.

The operator's estimate is a floor, a probe's measured peak refines it upwards: placement uses the
larger of the two, so an estimate that was too low never lets a model in where its measured peak
does not fit, and a generous estimate is never shrunk by a probe that ran light.
"""

from __future__ import annotations

from typing import Protocol


class ProfileMemory(Protocol):
    @property
    def ram_estimate_bytes(self) -> int: ...

    @property
    def vram_estimate_bytes(self) -> int: ...

    @property
    def ram_measured_peak_bytes(self) -> int | None: ...

    @property
    def vram_measured_peak_bytes(self) -> int | None: ...


def profile_envelope(profile: ProfileMemory) -> tuple[int, int]:
    """(ram, vram) bytes: max(estimate, measured peak) for each."""
    return (
        max(profile.ram_estimate_bytes or 0, profile.ram_measured_peak_bytes or 0),
        max(profile.vram_estimate_bytes or 0, profile.vram_measured_peak_bytes or 0),
    )

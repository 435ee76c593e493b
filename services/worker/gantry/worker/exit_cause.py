"""Why a model host exited on its own: crash, OOM kill (only with kernel evidence), or hung.

The kernel counts OOM kills per cgroup (`oom_kill` in cgroup v2 `memory.events`, or in cgroup v1
`memory.oom_control`). The supervisor reads the worker's counter when a host starts and again after
it exits; a SIGKILL with a grown counter is an OOM kill. Without a readable counter a SIGKILL is
reported as a crash whose message says the evidence was unavailable: we never guess.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from gantry.common.errors import GantryError
from gantry.worker.model_host.exit_status import describe_returncode

_CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class OomCounter:
    """The one file holding the worker's cgroup OOM-kill counter; `read()` is None if unreadable."""

    path: Path | None
    why_unavailable: str = ""

    @classmethod
    def for_current_process(
        cls, *, proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = _CGROUP_ROOT
    ) -> OomCounter:
        try:
            lines = proc_cgroup.read_text().splitlines()
        except OSError as exc:
            return cls(None, f"cannot read {proc_cgroup}: {exc}")
        for line in lines:
            hierarchy, _, rest = line.partition(":")
            controllers, _, cgroup_path = rest.partition(":")
            relative = cgroup_path.lstrip("/")
            if hierarchy == "0" and controllers == "":
                candidates = [root / relative / "memory.events", root / "memory.events"]
            elif "memory" in controllers.split(","):
                mount = root / "memory"
                candidates = [mount / relative / "memory.oom_control", mount / "memory.oom_control"]
            else:
                continue
            # Inside a cgroup namespace the path may be "/" while the mount is already ours.
            for candidate in candidates:
                if _read_oom_kills(candidate) is not None:
                    return cls(candidate)
        return cls(None, "no readable oom_kill counter for this process's memory cgroup")

    def read(self) -> int | None:
        return _read_oom_kills(self.path) if self.path is not None else None

    def describe(self) -> str:
        return str(self.path) if self.path is not None else self.why_unavailable


def _read_oom_kills(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def classify_exit(
    *,
    deployment_id: str,
    pid: int,
    returncode: int,
    oom_kills_before: int | None,
    oom_kills_after: int | None,
    oom_counter: str,
    killed_as_unresponsive: bool = False,
) -> GantryError:
    """The failure a resident reports for an exit it did not ask for."""
    metadata = {"deployment_id": deployment_id, "pid": str(pid), "returncode": str(returncode)}
    if killed_as_unresponsive:
        return GantryError(
            "RUNTIME_UNRESPONSIVE",
            f"model host {deployment_id!r} (pid {pid}) missed its ping deadline and was killed",
            **metadata,
        )
    if returncode == -signal.SIGKILL:
        if oom_kills_before is None or oom_kills_after is None:
            return GantryError(
                "RUNTIME_CRASHED",
                f"model host {deployment_id!r} (pid {pid}) was killed by SIGKILL; OOM evidence "
                f"unavailable ({oom_counter}), so the cause is unknown",
                **metadata,
            )
        if oom_kills_after > oom_kills_before:
            return GantryError(
                "RUNTIME_OOM_KILLED",
                f"model host {deployment_id!r} (pid {pid}) was killed by SIGKILL and the memory "
                f"cgroup recorded {oom_kills_after - oom_kills_before} new OOM kill(s) "
                f"({oom_counter})",
                **metadata,
            )
        return GantryError(
            "RUNTIME_CRASHED",
            f"model host {deployment_id!r} (pid {pid}) was killed by SIGKILL; no OOM kill was "
            f"recorded ({oom_counter})",
            **metadata,
        )
    return GantryError(
        "RUNTIME_CRASHED",
        f"model host {deployment_id!r} (pid {pid}) exited with {describe_returncode(returncode)}",
        **metadata,
    )

"""The model host's self-imposed sandbox: what it may touch, entering it, and the level it reached.

The child enters the sandbox after it has read its load request and before it reads one byte of
the model: from then on it may read and execute the interpreter and its libraries, read the
verified artifact directory, and write only its private scratch directory; TCP bind and connect
are refused by the kernel where Landlock's ABI has network rules (>= 4), and a seccomp filter
refuses every socket but AF_NETLINK (UDP and DNS included, which Landlock does not cover) and
every `connect`, so no pathname Unix socket outside the sandbox is reachable either; a host on a
CUDA device keeps AF_UNIX and `connect`, which its driver needs (see `seccomp`). The
Python-level network guard in `hardening` stays as defence in depth; it is not a sandbox
(`_socket`, native code and subprocesses go around it). Each layer the kernel refuses is
reported as missing with its errno (`NONE`, no `+SECCOMP_NET`); a worker that requires more
refuses to run the host.
"""

from __future__ import annotations

import glob
import os
import platform
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gantry.common.errors import GantryError
from gantry.worker.model_host import landlock, seccomp
from gantry.worker.model_host.landlock import (
    SECCOMP_NET_SUFFIX,
    Isolation,
    IsolationLevel,
    PathRule,
)

TRACE_FILE_ENV = "GANTRY_TRACE_FILE"


@dataclass(frozen=True, kw_only=True)
class IsolationRequirement:
    """The least isolation a worker accepts: a Landlock level, and whether the seccomp socket
    filter must be in place too. Met by a host at that level or above that has the filter when
    it is required; spelled on the wire like the isolation a host reports."""

    level: IsolationLevel = IsolationLevel.NONE
    seccomp_net: bool = False

    @property
    def wire(self) -> str:
        return self.level.name + (SECCOMP_NET_SUFFIX if self.seccomp_net else "")

    def met_by(self, isolation: Isolation) -> bool:
        return isolation.level >= self.level and (isolation.seccomp_net or not self.seccomp_net)


# `--require-isolation` values, weakest first; each one's hosts meet every one before it.
REQUIRE_CHOICES: dict[str, IsolationRequirement] = {
    "none": IsolationRequirement(),
    "fs": IsolationRequirement(level=IsolationLevel.LANDLOCK_FS),
    "fs-net": IsolationRequirement(level=IsolationLevel.LANDLOCK_FS_NET),
    "fs-net-seccomp": IsolationRequirement(level=IsolationLevel.LANDLOCK_FS_NET, seccomp_net=True),
}

# Outside the interpreter and the artifact: what the dynamic loader, glibc, torch's CPU probing
# and a null device need. Nothing here holds a secret; /proc is granted for this process only.
_SYSTEM_READ_EXECUTE = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")
_SYSTEM_READ = (
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/dev/urandom",
    "/proc/self",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/loadavg",  # the runnable count a pass's threads follow (pass_threads.py)
    "/sys/devices/system/cpu",
    "/sys/fs/cgroup",  # CPU quota probes (torch, numpy's thread pools)
)
_SYSTEM_READ_WRITE_FILES = ("/dev/null",)
# CUDA: the driver's device nodes (ioctl included), its parameters, and the PCI topology it reads.
_CUDA_DEVICES = "/dev/nvidia*"
_CUDA_READ = ("/proc/driver/nvidia", "/sys/bus/pci", "/sys/devices")


def _parse_wire(value: str) -> IsolationRequirement:
    level_name = value.removesuffix(SECCOMP_NET_SUFFIX)
    try:
        level = IsolationLevel[level_name]
    except KeyError:
        raise ValueError(f"unknown isolation level {value!r}") from None
    return IsolationRequirement(level=level, seccomp_net=level_name != value)


def parse_required(value: str) -> IsolationRequirement:
    """A flag or wire spelling (`fs-net`, `LANDLOCK_FS_NET+SECCOMP_NET`; empty = none)."""
    if not value:
        return IsolationRequirement()
    if value in REQUIRE_CHOICES:
        return REQUIRE_CHOICES[value]
    return _parse_wire(value)


def reported_isolation(wire: str, reason: str) -> Isolation:
    """The isolation a host reported; NONE when it did not say (a host that predates it)."""
    if not wire:
        return Isolation(level=IsolationLevel.NONE, reason="the host did not report its isolation")
    try:
        reported = _parse_wire(wire)
    except ValueError:
        return Isolation(
            level=IsolationLevel.NONE, reason=f"the host reported an unknown isolation {wire!r}"
        )
    return Isolation(
        level=reported.level,
        seccomp_net=reported.seccomp_net,
        reason=reason or "the host did not say why",
    )


def shortfall(
    required: IsolationRequirement, isolation: Isolation, *, deployment_id: str = ""
) -> GantryError | None:
    """RUNTIME_ENVIRONMENT_UNAVAILABLE when `isolation` does not meet `required`, naming both
    (and the deployment, when the worker refuses one of its children)."""
    if required.met_by(isolation):
        return None
    named = {"deployment_id": deployment_id} if deployment_id else {}
    return GantryError(
        "RUNTIME_ENVIRONMENT_UNAVAILABLE",
        f"this worker requires model host isolation {required.wire} but the host reached only "
        f"{isolation.wire}: {isolation.reason}",
        required_isolation=required.wire,
        isolation=isolation.wire,
        **named,
    )


def _interpreter_paths() -> Iterator[str]:
    yield from (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    yield os.path.dirname(os.path.realpath(sys.executable))
    yield from (entry for entry in sys.path if entry and os.path.isdir(entry))
    # Editable installs map `gantry` outside site-packages through a finder, not sys.path.
    gantry_package = sys.modules.get("gantry")
    yield from (entry for entry in getattr(gantry_package, "__path__", ()) if os.path.isdir(entry))
    yield from (entry for entry in os.environ.get("LD_LIBRARY_PATH", "").split(":") if entry)


def sandbox_rules(*, model_directory: Path, private_dir: Path, device: str) -> list[PathRule]:
    """Every path the sandboxed host may touch, and how; anything else is denied."""
    rules = [
        PathRule(path=Path(path), access=landlock.READ_EXECUTE) for path in _interpreter_paths()
    ]
    rules += [
        PathRule(path=Path(path), access=landlock.READ_EXECUTE) for path in _SYSTEM_READ_EXECUTE
    ]
    rules += [PathRule(path=Path(path), access=landlock.READ) for path in _SYSTEM_READ]
    rules += [
        PathRule(path=Path(path), access=landlock.READ | landlock.FS_WRITE_FILE)
        for path in _SYSTEM_READ_WRITE_FILES
    ]
    # Read-only: the host never needs to write its artifact, and must not be able to.
    rules.append(PathRule(path=model_directory, access=landlock.READ))
    rules.append(PathRule(path=private_dir, access=landlock.READ_WRITE))
    trace_file = os.environ.get(TRACE_FILE_ENV)
    if trace_file:
        # The exporter reopens the file for each span: it must exist before the rule is added.
        with open(trace_file, "a", encoding="utf-8"):
            pass
        rules.append(PathRule(path=Path(trace_file), access=landlock.FS_WRITE_FILE))
    if device.startswith("cuda"):
        rules += [
            PathRule(
                path=Path(node),
                access=landlock.READ | landlock.FS_WRITE_FILE | landlock.FS_IOCTL_DEV,
            )
            for node in glob.glob(_CUDA_DEVICES)
        ]
        rules += [PathRule(path=Path(path), access=landlock.READ) for path in _CUDA_READ]
    # An interpreter installed at / (or an empty LD_LIBRARY_PATH entry resolved there) must not
    # quietly grant the whole filesystem.
    return [rule for rule in rules if rule.path.resolve() != Path("/")]


def _running_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _enter_landlock(*, model_directory: Path, private_dir: Path, device: str) -> Isolation:
    try:
        rules = sandbox_rules(
            model_directory=model_directory.resolve(), private_dir=private_dir, device=device
        )
        return landlock.restrict_self(rules)
    except landlock.LandlockUnavailable as exc:
        return Isolation(level=IsolationLevel.NONE, reason=f"Landlock unavailable: {exc}")
    except OSError as exc:
        return Isolation(level=IsolationLevel.NONE, reason=f"sandbox rules not built: {exc}")


def enter(*, model_directory: Path, private_dir: Path, device: str) -> Isolation:
    """Restrict this process for good; what was reached and why (never raises for the kernel).

    Landlock and the seccomp filter are independent layers: either may be refused while the
    other holds, and the reason names both.
    """
    # Cached by `platform`, and it runs `uname -p`: ask before exec is confined.
    platform.processor()
    threads = _running_threads()
    if threads != 1:
        # restrict_self binds only the calling thread among those already running.
        return Isolation(
            level=IsolationLevel.NONE,
            reason=f"{threads} threads were running before the sandbox; it would bind only one",
        )
    confined = _enter_landlock(
        model_directory=model_directory, private_dir=private_dir, device=device
    )
    filtered = seccomp.install_socket_filter(
        seccomp.UnixSockets.CUDA if device.startswith("cuda") else seccomp.UnixSockets.DENIED
    )
    seccomp_reason = (
        filtered.reason
        if filtered.installed
        else f"seccomp socket filter not installed: {filtered.reason}"
    )
    return Isolation(
        level=confined.level,
        seccomp_net=filtered.installed,
        reason=f"{confined.reason}; {seccomp_reason}",
    )

"""The model host's self-imposed sandbox: what it may touch, entering it, and the level it reached.

The child enters the sandbox after it has read its load request and before it reads one byte of
the model: from then on it may read and execute the interpreter and its libraries, read the
verified artifact directory, and write only its private scratch directory; TCP bind and connect
are refused by the kernel where Landlock's ABI has network rules (>= 4). The Python-level network
guard in `hardening` stays as defence in depth; it is not a sandbox (`_socket`, native code and
subprocesses go around it). Where the kernel refuses Landlock the host runs unconfined and says so
(`NONE` and the errno); a worker that requires more refuses to run it.
"""

from __future__ import annotations

import glob
import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path

from gantry.common.errors import GantryError
from gantry.worker.model_host import landlock
from gantry.worker.model_host.landlock import Isolation, IsolationLevel, PathRule

TRACE_FILE_ENV = "GANTRY_TRACE_FILE"

# `--require-isolation` values, weakest first.
REQUIRE_CHOICES: dict[str, IsolationLevel] = {
    "none": IsolationLevel.NONE,
    "fs": IsolationLevel.LANDLOCK_FS,
    "fs-net": IsolationLevel.LANDLOCK_FS_NET,
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
    "/sys/devices/system/cpu",
    "/sys/fs/cgroup",  # CPU quota probes (torch, numpy's thread pools)
)
_SYSTEM_READ_WRITE_FILES = ("/dev/null",)
# CUDA: the driver's device nodes (ioctl included), its parameters, and the PCI topology it reads.
_CUDA_DEVICES = "/dev/nvidia*"
_CUDA_READ = ("/proc/driver/nvidia", "/sys/bus/pci", "/sys/devices")


def parse_required(value: str) -> IsolationLevel:
    """A wire or flag spelling (`fs-net`, `LANDLOCK_FS_NET`; empty = none) as a level."""
    if not value:
        return IsolationLevel.NONE
    if value in REQUIRE_CHOICES:
        return REQUIRE_CHOICES[value]
    try:
        return IsolationLevel[value]
    except KeyError:
        raise ValueError(f"unknown isolation level {value!r}") from None


def shortfall(required: IsolationLevel, isolation: Isolation) -> GantryError | None:
    """RUNTIME_ENVIRONMENT_UNAVAILABLE when `isolation` is below `required`, naming both."""
    if isolation.level >= required:
        return None
    return GantryError(
        "RUNTIME_ENVIRONMENT_UNAVAILABLE",
        f"this worker requires model host isolation {required.name} but the host reached only "
        f"{isolation.level.name}: {isolation.reason}",
        required_isolation=required.name,
        isolation=isolation.level.name,
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


def enter(*, model_directory: Path, private_dir: Path, device: str) -> Isolation:
    """Restrict this process for good; the level reached and why (never raises for the kernel)."""
    # Cached by `platform`, and it runs `uname -p`: ask before exec is confined.
    platform.processor()
    threads = _running_threads()
    if threads != 1:
        # restrict_self binds only the calling thread among those already running.
        return Isolation(
            level=IsolationLevel.NONE,
            reason=f"{threads} threads were running before the sandbox; it would bind only one",
        )
    try:
        rules = sandbox_rules(
            model_directory=model_directory.resolve(), private_dir=private_dir, device=device
        )
        return landlock.restrict_self(rules)
    except landlock.LandlockUnavailable as exc:
        return Isolation(level=IsolationLevel.NONE, reason=f"Landlock unavailable: {exc}")
    except OSError as exc:
        return Isolation(level=IsolationLevel.NONE, reason=f"sandbox rules not built: {exc}")

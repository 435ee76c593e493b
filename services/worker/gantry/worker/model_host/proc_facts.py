"""Facts about a process: who is at a pid (pid reuse) and its memory, read with psutil.

One fact psutil does not offer stays a read of /proc/<pid>/status: the resident set's high-water
mark (VmHWM). Every reader answers None, never 0, when the process is gone or unreadable. The
model host calls these on itself from inside its sandbox, which grants /proc/self (the same
directory as /proc/<its pid>, where psutil reads).
"""

from __future__ import annotations

from pathlib import Path

import psutil


def process_identity(pid: int) -> psutil.Process | None:
    """The process now at `pid` as psutil identifies it: its pid and its start time since boot
    (unaffected by a clock step), compared by `==`. An earlier answer equals a later one only
    when no other process has reused the pid meanwhile; None when no process is there."""
    try:
        return psutil.Process(pid)
    except (psutil.Error, ValueError):
        return None


def _process(pid: int | str) -> psutil.Process:
    return psutil.Process(None if pid == "self" else int(pid))


def rss_bytes_of(pid: int | str = "self") -> int | None:
    """Current resident set size (the kernel's VmRSS counter, never the VmHWM peak); None when
    unreadable."""
    try:
        return int(_process(pid).memory_info().rss)
    except (psutil.Error, OSError, ValueError):
        return None


def status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A memory field of /proc/<pid>/status (`VmHWM`, ...) in bytes; None if unreadable.

    The kernel writes these lines as `VmHWM:     12345 kB` (kB meaning KiB).
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    prefix = f"{field}:"
    for line in status.splitlines():
        if line.startswith(prefix):
            parts = line[len(prefix) :].split()
            if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                return int(parts[0]) * 1024
            return None
    return None


def peak_rss_bytes_of(pid: int | str = "self") -> int | None:
    """The resident set's high-water mark, VmHWM: a peak, to be named as one. psutil has no
    reader for it on Linux, so it is the one fact read from /proc/<pid>/status here."""
    return status_bytes("VmHWM", pid)

"""Facts about a process read from /proc: its start time (pid reuse) and its memory."""

from __future__ import annotations

from pathlib import Path


def process_start_ticks(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat: tells our child apart from a later process reusing its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; the fields after it start past its ')'.
    fields_after_name = stat[stat.rindex(")") + 2 :].split()
    return fields_after_name[19] if len(fields_after_name) > 19 else None


def status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A memory field of /proc/<pid>/status (`VmRSS`, `VmHWM`, ...) in bytes; None if unreadable.

    The kernel writes these lines as `VmRSS:     12345 kB` (kB meaning KiB).
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


def rss_bytes_of(pid: int | str = "self") -> int | None:
    """Current resident set size, VmRSS (never the VmHWM peak); None when unreadable."""
    return status_bytes("VmRSS", pid)


def peak_rss_bytes_of(pid: int | str = "self") -> int | None:
    """The resident set's high-water mark, VmHWM: a peak, to be named as one."""
    return status_bytes("VmHWM", pid)

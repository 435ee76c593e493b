"""Facts about a process read from /proc: its start time (pid reuse) and its current RSS."""

from __future__ import annotations

import os
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


def rss_bytes_of(pid: int | str = "self") -> int | None:
    """Current resident set size from /proc/<pid>/statm (never a peak); None when unreadable."""
    try:
        resident_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")

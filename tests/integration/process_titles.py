"""Finding a model host by the title it gives itself (what `ps` shows), as an operator would."""

from __future__ import annotations

from pathlib import Path


def _parent(entry: Path) -> int | None:
    try:
        stat = (entry / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so read after the last.
    return int(stat.rpartition(")")[2].split()[1])


def pids_titled(title: str, *, parent: int | None = None) -> list[int]:
    """Processes whose /proc/<pid>/cmdline is exactly `title`; with `parent`, only its children.

    `parent` tells the host from a process it forks: between its fork and exec such a child
    carries the same title (a fresh-clone run found two while a probe host was importing)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.split(b"\0")[0].decode(errors="replace") != title:
                continue
            if parent is None or _parent(entry) == parent:
                pids.append(int(entry.name))
    return pids

"""The table `make bench` ends with: each measure beside its baseline from the same run and its
target, and whether it was met. A target not met says what holds it (the floor measured alone)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Row:
    measure: str
    gantry: str
    baseline: str
    target: str
    met: bool | None  # None: reported, no target to meet here
    why: str = ""  # for a target not met: the measured floor that holds it


@dataclass
class Summary:
    rows: list[Row] = field(default_factory=list)

    def add(
        self,
        measure: str,
        gantry: str,
        baseline: str,
        target: str,
        met: bool | None,
        why: str = "",
    ) -> None:
        self.rows.append(Row(measure, gantry, baseline, target, met, why))

    def print(self, title: str) -> None:
        print(f"\n{title}")
        headers = ("Measure", "Gantry", "Baseline (same run)", "Target", "Met")
        verdicts = {True: "yes", False: "NO", None: "-"}
        cells = [(r.measure, r.gantry, r.baseline, r.target, verdicts[r.met]) for r in self.rows]
        widths = [max(len(str(c[i])) for c in [headers, *cells]) for i in range(len(headers))]
        line = "  " + "  ".join(f"{{:<{w}}}" for w in widths)
        print(line.format(*headers))
        print(line.format(*("-" * w for w in widths)))
        for row, cell in zip(self.rows, cells, strict=True):
            print(line.format(*cell))
            if row.why and row.met is False:
                print(f"      why not met: {row.why}")


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU of a process (this one by default), from /proc/<pid>/stat."""
    with open(f"/proc/{pid or 'self'}/stat") as stat_file:
        stat = stat_file.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_ns(pid: int) -> int:
    """CPU time of all of a process's threads, in ns (schedstat: /proc/<pid>/stat counts in clock
    ticks, 10 ms here, too coarse for a spin of a few ms)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as schedstat:
                total += int(schedstat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total


def model_host_pids() -> list[int]:
    """Model host processes of this user on this machine (by their process title)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                title = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if title.startswith("gantry model-host "):
            found.append(int(entry))
    return found

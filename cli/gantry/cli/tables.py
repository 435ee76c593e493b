"""Plain-text tables and the value formats operator commands print."""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Sequence

from google.protobuf import timestamp_pb2

# The console width a table is laid out on: wider than any table, so Rich never wraps a row.
_NEVER_WRAP = 1 << 20


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart; a header row even when there are no rows.

    Rich lays the columns out (by terminal cell width, so wide characters line up) on a console
    wider than any table: a row never wraps, whatever the terminal's width, since scripts and
    tests read the table line by line. No colour, no markup: a cell prints as it is.
    """
    # Imported here: most commands print no table, and `gantry --help` should not pay for Rich.
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="", show_edge=False)
    for header in headers:
        table.add_column(Text(header), no_wrap=True, overflow="ignore")
    for row in rows:
        # Tabs expanded first: Rich measures a tab as one cell and then drops what it pushes out.
        table.add_row(*(Text(cell.expandtabs()) for cell in row))
    buffer = io.StringIO()
    Console(file=buffer, width=_NEVER_WRAP, color_system=None, highlight=False).print(table)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def enum_label(name: str, prefix: str) -> str:
    """`DEPLOYMENT_STATE_READY` -> `READY`."""
    return name.removeprefix(prefix) if name.startswith(prefix) else name


def format_timestamp(value: timestamp_pb2.Timestamp, *, now: dt.datetime | None = None) -> str:
    """UTC time and how long ago; `never` for an unset timestamp."""
    if value.seconds == 0 and value.nanos == 0:
        return "never"
    moment = value.ToDatetime(tzinfo=dt.UTC)
    age_s = int(((now or dt.datetime.now(dt.UTC)) - moment).total_seconds())
    ago = "in the future" if age_s < 0 else seconds_ago(age_s)
    return f"{moment:%Y-%m-%d %H:%M:%S}Z ({ago})"


def seconds_ago(seconds: int) -> str:
    """A past age (0 or more seconds) in its largest fitting unit: 90s, 5m, 3h, 2d ago."""
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60}m ago"
    if seconds < 172800:
        return f"{seconds // 3600}h ago"
    return f"{seconds // 86400}d ago"


def format_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000:
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"

"""The worker's liveness file: rewritten on each tick of the worker's heartbeat and reconnect
loops, connected to the control plane or not, judged by `gantry worker --check` (the Kubernetes
liveness probe).

Liveness is about this process, not the control plane: a worker cut off from a restarting control
plane keeps its model hosts and reconnects, so the file stays fresh and says `connected: false`
(and since when). Only a loop that stopped ticking (a hung process) lets the file go stale.

The file is replaced whole (temporary file, then rename), so a reader sees the previous record or
the next one, never half of one. It carries the heartbeat interval the control plane's Welcome
named, so the check's default patience follows the control plane's setting, not a guess.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from gantry.common.clock import Clock, SystemClock

log = logging.getLogger(__name__)

# Used until a record names the interval: the control plane's default heartbeat interval.
DEFAULT_INTERVAL_S = 3.0
# A live worker misses at most a couple of beats (a slow write, a busy loop); three is a hang.
MISSED_BEATS_ALLOWED = 3


def default_heartbeat_file() -> Path:
    """Per user under the temporary directory: writable where the root filesystem is read-only
    (`/tmp` is the worker image's one writable path), and the same path for the worker and for a
    probe run beside it as the same user. Several workers of one user on one machine each need
    their own `--heartbeat-file`."""
    return Path(tempfile.gettempdir()) / f"gantry-worker-{os.getuid()}" / "heartbeat"


@dataclass(frozen=True, kw_only=True)
class HeartbeatRecord:
    sent_at: dt.datetime  # timezone-aware UTC
    interval_s: float
    node_id: str
    generation: int
    pid: int
    connected: bool = True  # welcomed by the control plane on a live stream
    disconnected_since: dt.datetime | None = None  # set while not connected

    def to_json(self) -> str:
        fields = asdict(self)
        fields["sent_at"] = self.sent_at.isoformat()
        since = self.disconnected_since
        fields["disconnected_since"] = since.isoformat() if since is not None else None
        return json.dumps(fields, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> HeartbeatRecord:
        """Raises ValueError for anything but a whole record."""
        try:
            fields = json.loads(text)
            sent_at = dt.datetime.fromisoformat(fields["sent_at"])
            since_text = fields.get("disconnected_since")
            since = dt.datetime.fromisoformat(since_text) if since_text is not None else None
            record = cls(
                sent_at=sent_at,
                interval_s=float(fields["interval_s"]),
                node_id=str(fields["node_id"]),
                generation=int(fields["generation"]),
                pid=int(fields["pid"]),
                # Absent in files written only while welcomed (before this field existed).
                connected=bool(fields.get("connected", True)),
                disconnected_since=since,
            )
        except (TypeError, KeyError, ValueError) as exc:  # JSONDecodeError is a ValueError
            raise ValueError(f"not a heartbeat record ({type(exc).__name__}: {exc})") from None
        if sent_at.tzinfo is None or (since is not None and since.tzinfo is None):
            raise ValueError("not a heartbeat record (a time has no time zone)")
        return record


@dataclass(frozen=True, kw_only=True)
class Verdict:
    fresh: bool
    reason: str  # one line, what the probe prints


def judge_heartbeat(contents: str | None, *, now: dt.datetime, max_age_s: float | None) -> Verdict:
    """Whether the worker behind this file is alive. `contents` None: there is no file yet.

    `max_age_s` None: MISSED_BEATS_ALLOWED of the interval the record names.
    """
    if contents is None:
        return Verdict(fresh=False, reason="no heartbeat file yet: no worker loop has written it")
    try:
        record = HeartbeatRecord.from_json(contents)
    except ValueError as exc:
        return Verdict(fresh=False, reason=f"heartbeat file unreadable: {exc}")
    interval_s = record.interval_s if record.interval_s > 0 else DEFAULT_INTERVAL_S
    limit_s = max_age_s if max_age_s is not None else MISSED_BEATS_ALLOWED * interval_s
    age_s = (now - record.sent_at).total_seconds()
    described = f"node {record.node_id} generation {record.generation} pid {record.pid}"
    if age_s > limit_s:
        return Verdict(
            fresh=False,
            reason=f"heartbeat stale by {age_s - limit_s:.1f} s: last at "
            f"{record.sent_at:%Y-%m-%d %H:%M:%S}Z, {age_s:.1f} s ago, max age {limit_s:g} s "
            f"({described})",
        )
    if record.connected:
        link = "connected"
    elif record.disconnected_since is not None:
        away_s = max((now - record.disconnected_since).total_seconds(), 0.0)
        link = f"disconnected for {away_s:.0f} s, reconnecting"
    else:
        link = "disconnected, reconnecting"
    return Verdict(
        fresh=True, reason=f"heartbeat {max(age_s, 0.0):.1f} s ago, {link} ({described})"
    )


def read_heartbeat(path: Path) -> str | None:
    """The file's text; None when it does not exist. Other failures raise OSError."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise OSError(f"{path} is not text: {exc.reason}") from None


class HeartbeatFile:
    """Writes the record; a failed write is logged (once per distinct error), never raised: the
    probe then sees a stale file, which is the truth about a worker that cannot write it."""

    def __init__(self, path: Path, *, clock: Clock | None = None) -> None:
        self.path = path
        self._clock = clock or SystemClock()
        self._last_error = ""
        self._disconnected_since: dt.datetime | None = None

    def record(
        self, *, interval_s: float, node_id: str, generation: int, connected: bool = True
    ) -> None:
        """One tick. The first record not connected after a connected one (or the first of all)
        starts the disconnected period the probe reports."""
        now = self._clock.now()
        if connected:
            self._disconnected_since = None
        elif self._disconnected_since is None:
            self._disconnected_since = now
        record = HeartbeatRecord(
            sent_at=now,
            interval_s=interval_s,
            node_id=node_id,
            generation=generation,
            pid=os.getpid(),
            connected=connected,
            disconnected_since=self._disconnected_since,
        )
        try:
            self._write(record.to_json())
        except OSError as exc:
            message = f"cannot write the heartbeat file {self.path}: {exc}"
            if message != self._last_error:
                log.warning("%s", message)
                self._last_error = message
            return
        self._last_error = ""

    def _write(self, text: str) -> None:
        directory = self.path.parent
        if not directory.exists():
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.path == default_heartbeat_file():
            # A shared temporary directory: a directory (or link) planted there by another user
            # must not receive our writes.
            listed = os.lstat(directory)
            if not stat.S_ISDIR(listed.st_mode) or listed.st_uid != os.getuid():
                raise OSError(f"{directory} is not a directory of this user")
        temporary = directory / f".{self.path.name}.{os.getpid()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        descriptor = os.open(temporary, flags, 0o644)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(text)
            # No fsync: liveness, not durability; a slow disk must not stall the event loop.
            os.replace(temporary, self.path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise

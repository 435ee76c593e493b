"""Runs named child processes: one log file each, restarts with backoff, ordered shutdown."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gantry.cli.restart_policy import BackoffSettings, RestartBackoff
from gantry.common.clock import Clock, SystemClock

Report = Callable[[str], None]


def report_to_stderr(line: str) -> None:
    print(f"gantry: {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildSpec:
    name: str
    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None  # the full environment; None inherits ours
    # SIGTERM to SIGKILL when stopping; None: the supervisor's `stop_timeout_s`. A child with a
    # stop bound of its own (the worker) gets one derived from it (`common.process.stop_grace_s`).
    stop_timeout_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StopResult:
    name: str
    pid: int | None  # None: it was not running when shutdown began
    returncode: int | None
    killed: bool


@dataclass(slots=True)
class _Child:
    spec: ChildSpec
    backoff: RestartBackoff
    process: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None
    start_count: int = 0
    force_killed: bool = False


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


class Supervisor:
    """Children in start order; `poll()` reaps and restarts, `stop_all()` stops in reverse order,
    `force_stop()` kills them all at once (also in the middle of a `stop_all()`).

    All decisions about timing come from the injected clock and RestartBackoff; this class only
    starts, polls and signals processes, so tests drive it with a ManualClock and tiny children.
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        backoff: BackoffSettings | None = None,
        report: Report = report_to_stderr,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self._clock = clock or SystemClock()
        self._backoff = backoff or BackoffSettings()
        self._report = report
        self._stop_timeout_s = stop_timeout_s
        self._children: list[_Child] = []
        self._lock = threading.RLock()
        self._stopping = False
        self._forced = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # -- queries ---------------------------------------------------------------------------
    def pid(self, name: str) -> int | None:
        with self._lock:
            process = self._child(name).process
            return process.pid if process is not None and process.poll() is None else None

    def start_count(self, name: str) -> int:
        with self._lock:
            return self._child(name).start_count

    def names(self) -> list[str]:
        with self._lock:
            return [child.spec.name for child in self._children]

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, spec: ChildSpec) -> None:
        with self._lock:
            if self._stopping:
                raise RuntimeError("the supervisor is shutting down")
            if any(child.spec.name == spec.name for child in self._children):
                raise ValueError(f"a child named {spec.name!r} is already supervised")
            child = _Child(spec=spec, backoff=RestartBackoff(self._backoff, self._clock))
            self._children.append(child)
            self._spawn(child)

    def poll(self) -> None:
        """Reap children that exited and restart those whose backoff has elapsed."""
        with self._lock:
            if self._stopping:
                return
            now = self._clock.monotonic()
            for child in self._children:
                if child.process is not None:
                    returncode = child.process.poll()
                    if returncode is not None:
                        self._schedule_restart(child, now, describe_exit(returncode))
                elif child.restart_at is not None and now >= child.restart_at:
                    self._spawn(child)
                    if child.process is not None:
                        self._report(
                            f"restarted {child.spec.name} (pid {child.process.pid},"
                            f" start #{child.start_count})"
                        )

    def run_in_background(self, interval_s: float = 0.2) -> None:
        """Poll on a daemon thread until stop_all()."""

        def loop() -> None:
            while not self._wake.wait(interval_s):
                try:
                    self.poll()
                except Exception as exc:  # keep supervising: one bad poll must not orphan all
                    self._report(f"supervisor poll failed: {exc!r}")

        self._thread = threading.Thread(target=loop, name="gantry-supervisor", daemon=True)
        self._thread.start()

    def stop_all(self) -> list[StopResult]:
        """Stop every child, last started first (SIGTERM, then SIGKILL after its timeout)."""
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            self._stopping = True
            children = list(reversed(self._children))
        return [self._stop(child) for child in children]

    def force_stop(self) -> None:
        """SIGKILL every child's process group now; a stop_all() under way only reaps them.

        Called from a signal handler on the thread that may be inside stop_all(), so it takes
        no lock: a snapshot of the list is enough, and `_forced` stops anything spawned later.
        """
        self._forced = True
        self._stopping = True
        self._wake.set()
        for child in list(self._children):
            process = child.process
            if process is not None and process.poll() is None:
                child.force_killed = True
                self._kill_group(process)

    # -- process IO ------------------------------------------------------------------------
    def _child(self, name: str) -> _Child:
        for child in self._children:
            if child.spec.name == name:
                return child
        raise KeyError(name)

    def _spawn(self, child: _Child) -> None:
        spec = child.spec
        child.restart_at = None
        child.start_count += 1
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(spec.log_path, "ab") as log:
                stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
                log.write(f"--- {stamp}Z gantry up: starting {spec.name} ---\n".encode())
                log.flush()
                child.process = subprocess.Popen(
                    list(spec.argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=dict(spec.env) if spec.env is not None else None,
                    close_fds=True,
                    # Its own process group: a terminal's Ctrl-C reaches only the supervisor,
                    # which then stops the children in order instead of all at once.
                    process_group=0,
                )
        except OSError as exc:
            child.process = None
            self._schedule_restart(child, self._clock.monotonic(), f"a failed start ({exc})")
            return
        child.backoff.started()

    def _schedule_restart(self, child: _Child, now: float, how: str) -> None:
        pid = child.process.pid if child.process is not None else None
        uptime_s = child.backoff.uptime_s()
        delay_s = child.backoff.exited()
        child.process = None
        child.restart_at = now + delay_s
        who = f"{child.spec.name} (pid {pid})" if pid is not None else child.spec.name
        self._report(
            f"{who} exited with {how} after {uptime_s:.1f}s; restarting in {delay_s:g}s"
            f" (log: {child.spec.log_path})"
        )

    def _stop(self, child: _Child) -> StopResult:
        process, name = child.process, child.spec.name
        if process is not None and self._forced and process.poll() is None:
            child.force_killed = True
            self._kill_group(process)
        if process is None or (process.poll() is not None and not child.force_killed):
            self._report(f"{name} was not running")
            return StopResult(name=name, pid=None, returncode=None, killed=False)
        if not child.force_killed:
            process.send_signal(signal.SIGTERM)
        timed_out = False
        timeout_s = child.spec.stop_timeout_s
        try:
            returncode = process.wait(
                timeout=self._stop_timeout_s if timeout_s is None else timeout_s
            )
        except subprocess.TimeoutExpired:
            timed_out = True
            self._kill_group(process)
            returncode = process.wait()
        if child.force_killed:
            how = "killed (forced)"
        elif timed_out:
            how = "killed after it ignored SIGTERM"
        else:
            how = describe_exit(returncode)
        self._report(f"stopped {name} (pid {process.pid}): {how}")
        killed = timed_out or child.force_killed
        return StopResult(name=name, pid=process.pid, returncode=returncode, killed=killed)

    @staticmethod
    def _kill_group(process: subprocess.Popen[bytes]) -> None:
        # The child leads its own group: killing the group also takes anything it left behind.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            process.kill()

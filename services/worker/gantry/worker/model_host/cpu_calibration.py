"""The model hosts' CPU wait policy, measured once per machine and runtime environment (the
choice itself is `cpu_policy`'s): the trials, their cache, and what a starting host is given.

The worker starts a calibration for its default environment when it starts (`HostCpu.start`),
before its warm pool's fork server, so that server and the hosts it forks get the choice; another
environment is measured when a load first meets it. Each
candidate spin is a short process of its own (`cpu_trial`, about 2 s with torch's import); they
run one after another, so they do not measure each other. The choice is kept in a JSON file
named after the interpreter and the machine's CPUs (`cpu_policy.cache_name`), so a later worker
on the same machine reads it instead of measuring again, unless the machine's other work took
more than `cpu_policy.QUIET_SHARE` of its CPUs while the trials ran (/proc/stat against the
trials' own CPU): then the choice serves this worker only, a warning says why, and the next
worker measures again.

`python -m gantry.worker.model_host.cpu_calibration` measures (or reads) the choice of the
interpreter that runs it: `make host-cpu` runs it in .venv and .venv-vision before `make run` and
`make test` start anything, so a worker started from a fresh build finds it kept and its first
host waits for nothing. A host that starts while its environment's calibration runs waits for it
at most half its load time; without a choice (none started, a trial failed, the wait ran out) it
gets `environments.HOST_CPU_DEFAULTS` (PASSIVE), the policy that never takes a neighbour's cores.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import resource
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from gantry.worker.model_host import cpu_policy
from gantry.worker.model_host.environments import host_environment

log = logging.getLogger("gantry.worker.model_host")

TRIAL_MODULE = "gantry.worker.model_host.cpu_trial"
TRIAL_TIMEOUT_S = 120.0
# The machine's CPU time since boot, all CPUs together: its first line.
PROC_STAT = "/proc/stat"


def default_cache_dir() -> Path:
    """Per user and machine: the choice is the machine's and the environment's, not a worker's."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gantry"


def _machine_facts(python_executable: str) -> list[str]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    try:
        built = str(os.stat(python_executable).st_mtime_ns)
    except OSError:
        built = ""
    return [model, str(len(os.sched_getaffinity(0))), built]


def _run_trial(
    python_executable: str, environment: Mapping[str, str], spin: int
) -> tuple[list[cpu_policy.Trial], int]:
    with tempfile.TemporaryDirectory(prefix="gantry-cpu-trial-") as scratch:
        trial_environment = {
            **host_environment(environment, private_dir=Path(scratch), scratch_dir=Path(scratch)),
            cpu_policy.SPIN_VARIABLE: str(spin),
        }
        trial_environment.pop("OMP_WAIT_POLICY", None)  # GOMP_SPINCOUNT decides alone
        # The operator's thread count is theirs: only it is tried.
        only_default = ["--default-threads"] if cpu_policy.THREADS_VARIABLE in environment else []
        done = subprocess.run(
            [python_executable, "-I", "-m", TRIAL_MODULE, *only_default],
            env=trial_environment,
            cwd=scratch,
            capture_output=True,
            text=True,
            timeout=TRIAL_TIMEOUT_S,
            check=True,
        )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise ValueError(f"{TRIAL_MODULE} printed no figures: {done.stderr[-300:]}")
    return [
        cpu_policy.Trial(
            spin=spin, threads=line["threads"], p50_ms=line["p50_ms"], cpu_ms=line["cpu_ms"]
        )
        for line in lines
    ], int(lines[0]["default_threads"])


def machine_busy_s(path: str = PROC_STAT) -> float | None:
    """CPU seconds the machine's CPUs have spent busy since boot (user, nice, system, irq,
    softirq and steal: time a hypervisor gave another guest is time the trials did not get);
    None where unreadable."""
    try:
        with open(path, encoding="ascii") as stat:
            fields = stat.readline().split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    """CPU seconds of this process's finished children: the trials, and any other child reaped
    while they ran (a model host that exits meanwhile counts as the trials' own, so the share of
    other work errs low, towards keeping)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def calibrate(
    python_executable: str, environment: Mapping[str, str]
) -> tuple[cpu_policy.Choice, float | None]:
    """Every candidate measured in `python_executable`, one process per spin, then the choice,
    and the share of the machine's CPUs other work took meanwhile (None where /proc/stat is
    unreadable). Raises OSError, subprocess.SubprocessError, ValueError (a trial that failed or
    printed nothing)."""
    trials: list[cpu_policy.Trial] = []
    default_threads = 0
    busy_before, own_before, started = machine_busy_s(), _children_cpu_s(), time.monotonic()
    for spin in cpu_policy.CANDIDATE_SPINS:
        figures, default_threads = _run_trial(python_executable, environment, spin)
        trials += figures
    busy_after = machine_busy_s()
    share = None
    if busy_before is not None and busy_after is not None:
        share = cpu_policy.others_share(
            machine_busy_s=busy_after - busy_before,
            own_cpu_s=_children_cpu_s() - own_before,
            elapsed_s=time.monotonic() - started,
            cpus=os.cpu_count() or 1,
        )
    return cpu_policy.choose(trials, default_threads=default_threads), share


def _cached_or_measured(
    python_executable: str, environment: Mapping[str, str], cache_dir: Path
) -> cpu_policy.Choice:
    """The choice kept for this interpreter on this machine, else one measured now (and kept).
    Raises what `calibrate` raises."""
    # The operator's thread count narrows what is tried: part of what the choice is for.
    facts = [
        *_machine_facts(python_executable),
        environment.get(cpu_policy.THREADS_VARIABLE, ""),
    ]
    path = cache_dir / cpu_policy.cache_name(python_executable, facts)
    try:
        kept = cpu_policy.Choice.from_json(path.read_text())
        # The kept trials decided by today's rule: a change of rule needs no new measurement.
        choice = cpu_policy.choose(kept.trials, default_threads=kept.default_threads)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none kept yet (or unreadable): measure
    else:
        log.info("model host CPU policy for %s (kept in %s): %s", python_executable, path,
                 choice.describe())  # fmt: skip
        return choice
    choice, share = calibrate(python_executable, environment)
    if share is not None and not cpu_policy.worth_keeping(share):
        log.warning(
            "model host CPU policy for %s, measured while other work took %.0f %% of the "
            "machine's CPUs: %s; used by this worker, not kept (the next one measures again)",
            python_executable,
            share * 100,
            choice.describe(),
        )
        return choice
    log.info(
        "model host CPU policy for %s, measured (other work took %s of the machine's CPUs "
        "meanwhile): %s",
        python_executable,
        "an unknown share" if share is None else f"{share:.0%}",
        choice.describe(),
    )
    with contextlib.suppress(OSError):  # unkept, it is measured again by the next worker
        cache_dir.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(choice.to_json())
        scratch.replace(path)
    return choice


class HostCpu:
    """The choices of one worker's runtime environments, kept in `cache_dir`; thread-safe, not
    bound to an event loop."""

    def __init__(self, cache_dir: Path) -> None:
        self._cache_dir = cache_dir
        self._lock = threading.Lock()
        self._choices: dict[str, concurrent.futures.Future[cpu_policy.Choice | None]] = {}

    def start(
        self, python_executable: str, environment: Mapping[str, str]
    ) -> concurrent.futures.Future[cpu_policy.Choice | None]:
        """Read the kept choice for `python_executable`, or measure it in a thread; once per
        interpreter. Nothing is measured when the operator set the wait policy."""
        with self._lock:
            future = self._choices.get(python_executable)
            if future is not None:
                return future
            future = concurrent.futures.Future()
            self._choices[python_executable] = future
        if cpu_policy.operator_chose(environment):
            future.set_result(None)
            return future
        environment = dict(environment)
        threading.Thread(
            target=self._settle,
            args=(future, python_executable, environment, self._cache_dir),
            name="host-cpu-calibration",
            daemon=True,
        ).start()
        return future

    def _settle(
        self,
        future: concurrent.futures.Future[cpu_policy.Choice | None],
        python_executable: str,
        environment: dict[str, str],
        cache_dir: Path,
    ) -> None:
        choice = None
        try:
            choice = _cached_or_measured(python_executable, environment, cache_dir)
        except Exception:
            # Whatever went wrong, the hosts must not wait for a choice that never comes.
            log.exception(
                "model host CPU calibration for %s failed; hosts wait PASSIVE", python_executable
            )
        finally:
            future.set_result(choice)

    async def choice_for(
        self, python_executable: str, environment: Mapping[str, str], *, wait_s: float
    ) -> cpu_policy.Choice | None:
        """The environment's choice (measured now when not met before), waiting for it at most
        `wait_s`; None: the operator's own settings, a failed measurement, or not in time."""
        future = self.start(python_executable, environment)
        try:
            # Shielded: a wait that runs out must not cancel the calibration for the next host.
            return await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(future)), max(0.0, wait_s)
            )
        except TimeoutError:
            log.warning(
                "model host CPU calibration for %s not done in %.0f s; this host waits PASSIVE",
                python_executable,
                wait_s,
            )
            return None


def main() -> int:
    """Measure (or read) the choice for this interpreter and say it; a failure is said and
    leaves nothing kept (hosts wait PASSIVE until a worker measures it): exit 0 either way,
    since an environment without a choice still serves."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m gantry.worker.model_host.cpu_calibration",
        description="measure the model hosts' CPU wait policy and threads for this interpreter "
        "on this machine, and keep it where `gantry worker --host-cpu-cache` reads it",
    )
    parser.add_argument("--cache-dir", type=Path, default=None, metavar="DIR")
    arguments = parser.parse_args()
    environment = dict(os.environ)
    if cpu_policy.operator_chose(environment):
        print(
            "the environment sets the wait policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT): "
            "none measured"
        )
        return 0
    try:
        choice = _cached_or_measured(
            sys.executable, environment, arguments.cache_dir or default_cache_dir()
        )
    except Exception as error:  # any failure: said, and the hosts wait PASSIVE
        print(f"not measured ({type(error).__name__}: {error}); model hosts wait PASSIVE")
        return 0
    print(f"model host CPU policy for {sys.executable}: {choice.describe()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

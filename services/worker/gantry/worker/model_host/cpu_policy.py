"""How a model host's CPU threads wait, chosen by measurement (pure: `cpu_calibration` measures).

Why not a fixed default: libgomp's own (spin about 3 ms after each parallel region, then sleep)
makes one sentence's forward pass fast, but on a node whose cores the worker, the control plane
or other hosts share, the spinning takes the CPU those need (issue 9 measured 17.4 ms of host CPU
per sentence spinning against 7.9 passive under 32 callers on 2 cores, and chose PASSIVE). PASSIVE
in turn made a forward pass alone about 30 % slower than a user's untuned encode (issue 29: the
threads must be woken for each of the pass's many short parallel regions).

So the choice is measured on the machine, per runtime environment: each candidate spin (libgomp's
GOMP_SPINCOUNT, which it honours whatever OMP_WAIT_POLICY says) and thread count runs the same
small encoder (`cpu_trial`), and `choose` takes, among the candidates whose forward pass is within
`LATENCY_TOLERANCE` of the fastest, the one that spins least, then the one that spends the least
CPU per pass when passes come with gaps between them (the CPU a resident takes from its
neighbours). A bounded spin keeps the threads awake across one pass's regions but asleep between
passes, so many residents on few cores do not burn each other's cores while idle, and the calls'
path (the worker agent, the control plane) finds a CPU free as the pass ends; an unbounded spin
wins only when it is the only way to be fast.

Why the spin before the CPU figure (issue 29, a 2-CPU machine): the CPU per gapped pass did not
tell the spins apart (10,000: 11.18 cpu-ms, 100,000: 11.36, 300,000: 11.01 in one measurement;
PASSIVE 8.85), so the least CPU fell to whichever spin the noise favoured, 300,000 or 100,000 in
two measurements of the same machine. Through `gantry up` at concurrency 1 (the bench's way, 200
calls in blocks against the untuned encode, six rounds each alternated), 10,000 against the
calibrated 300,000: p99 15.2-20.9 ms (median 16.1) against 17.5-25.5 (median 21.9), p50
6.2-10.1 ms against 7.3-9.8, both within the same noise. A spinning thread holds a CPU the
answer's way back needs; the pass alone cannot show that. The tolerance is 10 %: within it the
pass alone differs by less than the spin costs the call's tail (10,000 measured 3 % slower alone).

What the operator set (OMP_WAIT_POLICY, GOMP_SPINCOUNT, OMP_NUM_THREADS) is never
overridden: those are not measured at all.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

# libgomp spins about 100,000 times per ms (its own estimate; a CPU may be 5x either way).
# 0 is OMP_WAIT_POLICY=PASSIVE's spin; 300,000 libgomp's default, what an untuned process gets.
CANDIDATE_SPINS: tuple[int, ...] = (0, 10_000, 100_000, 300_000)
# A candidate this much slower than the fastest (relative, plus an absolute allowance for the
# timer's noise on a shared machine) is not fast enough, whatever spin or CPU it saves.
LATENCY_TOLERANCE = 0.10
LATENCY_ALLOWANCE_MS = 0.05
# A choice is kept for later workers only where the machine's other work took at most this
# share of its CPUs while the trials ran. Why (issue 29): one measured on a 2-CPU machine while
# it compiled llama.cpp timed the 2-thread candidates at 18.7 ms (spin 0) to 455 ms (spin
# 300,000) against 13.5 ms on one thread, and was kept: every later worker there ran its hosts on
# one thread, with nothing to say the figures were a busy minute's.
QUIET_SHARE = 0.25
# Variables an operator may set that make the choice theirs (then nothing is measured).
OPERATOR_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
THREADS_VARIABLE = "OMP_NUM_THREADS"
SPIN_VARIABLE = "GOMP_SPINCOUNT"


@dataclass(frozen=True, slots=True)
class Trial:
    """One candidate's figures from `cpu_trial`."""

    spin: int
    threads: int
    p50_ms: float  # a forward pass, back to back
    cpu_ms: float  # CPU of the process per pass, passes 2 ms apart


@dataclass(frozen=True, slots=True)
class Choice:
    spin: int
    threads: int
    default_threads: int  # torch's own choice in that environment (not set when equal)
    trials: tuple[Trial, ...]

    def environment(self) -> dict[str, str]:
        """The variables a host of this environment starts with."""
        chosen = {SPIN_VARIABLE: str(self.spin)}
        if self.threads != self.default_threads:
            chosen[THREADS_VARIABLE] = str(self.threads)
        return chosen

    def describe(self) -> str:
        """One line for the log and the load evidence: the choice and what it was chosen over."""
        figures = ", ".join(
            f"spin {t.spin}/{t.threads}t {t.p50_ms:.2f} ms {t.cpu_ms:.2f} cpu-ms"
            for t in self.trials
        )
        return (
            f"GOMP_SPINCOUNT={self.spin} threads={self.threads} "
            f"(measured: p50 per pass, CPU per gapped pass: {figures})"
        )

    def evidence(self) -> dict[str, str]:
        """The load evidence's entries (runtime_versions, values of at most 256 characters): the
        choice, and each trial as spin x threads: p50 ms / CPU ms per gapped pass."""
        trials = " ".join(
            f"{t.spin}x{t.threads}:{t.p50_ms:.2f}/{t.cpu_ms:.2f}" for t in self.trials
        )
        return {
            "host_cpu": f"GOMP_SPINCOUNT={self.spin} threads={self.threads}",
            "host_cpu_trials": trials[:256],
        }

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Choice:
        """Raises ValueError (or KeyError/TypeError) for a file that is not a choice."""
        fields = json.loads(text)
        return cls(
            spin=int(fields["spin"]),
            threads=int(fields["threads"]),
            default_threads=int(fields["default_threads"]),
            trials=tuple(Trial(**trial) for trial in fields["trials"]),
        )


def thread_candidates(default_threads: int) -> list[int]:
    """Torch's own count and half of it: fewer threads wait less for each other on busy cores."""
    return sorted({default_threads, max(1, default_threads // 2)}, reverse=True)


def choose(trials: Sequence[Trial], *, default_threads: int) -> Choice:
    """Among the candidates fast enough, the least spin, then the least CPU per gapped pass;
    ties: more threads. Raises ValueError without trials."""
    if not trials:
        raise ValueError("no calibration trial finished")
    fastest = min(trial.p50_ms for trial in trials)
    limit = fastest * (1 + LATENCY_TOLERANCE) + LATENCY_ALLOWANCE_MS
    eligible = [trial for trial in trials if trial.p50_ms <= limit]
    best = min(eligible, key=lambda t: (t.spin, round(t.cpu_ms, 2), -t.threads))
    return Choice(
        spin=best.spin, threads=best.threads, default_threads=default_threads, trials=tuple(trials)
    )


def others_share(*, machine_busy_s: float, own_cpu_s: float, elapsed_s: float, cpus: int) -> float:
    """The share of the machine's CPUs its other work took over `elapsed_s`: what the machine
    spent busy (its steal included) less the trials' own CPU."""
    if elapsed_s <= 0 or cpus <= 0:
        return 0.0
    return max(0.0, machine_busy_s - own_cpu_s) / (elapsed_s * cpus)


def worth_keeping(share: float) -> bool:
    """Whether a choice measured while other work took `share` of the CPUs is kept for later
    workers (it is used either way: it is this worker's best figure)."""
    return share <= QUIET_SHARE


def operator_chose(environment: Mapping[str, str]) -> bool:
    """The operator set the wait policy themselves: nothing is measured, nothing overridden."""
    return any(name in environment for name in OPERATOR_VARIABLES)


def cache_name(python_executable: str, facts: Iterable[str]) -> str:
    """The file a choice is kept in: per interpreter and per machine (`facts`: what identifies
    the machine's CPUs and the environment's build, e.g. the CPU model, the usable CPUs, the
    interpreter's and torch's modification times)."""
    digest = hashlib.sha256("\0".join([python_executable, *facts]).encode()).hexdigest()
    return f"host-cpu-{digest[:20]}.json"

"""The model host's CPU wait policy as chosen from measured trials (model_host/cpu_policy.py)."""

from __future__ import annotations

import pytest

from gantry.worker.model_host.cpu_policy import (
    QUIET_SHARE,
    Choice,
    Trial,
    cache_name,
    choose,
    operator_chose,
    others_share,
    thread_candidates,
    worth_keeping,
)


def trial(spin: int, p50_ms: float, cpu_ms: float, threads: int = 2) -> Trial:
    return Trial(spin=spin, threads=threads, p50_ms=p50_ms, cpu_ms=cpu_ms)


def test_among_the_fast_enough_the_bounded_spin_wins() -> None:
    # PASSIVE is 30 % slower than a spin (issue 29's case): not fast enough, whatever it saves;
    # of the spins within tolerance of the fastest, the bounded one.
    trials = [
        trial(0, p50_ms=9.6, cpu_ms=9.0),
        trial(10_000, p50_ms=7.5, cpu_ms=9.4),
        trial(300_000, p50_ms=7.4, cpu_ms=14.0),
    ]
    choice = choose(trials, default_threads=2)
    assert (choice.spin, choice.threads) == (10_000, 2)
    assert choice.environment() == {"GOMP_SPINCOUNT": "10000"}


def test_on_oversubscribed_cores_passive_is_both_faster_and_cheaper() -> None:
    # What this shared 2-core machine measured under load: spinning threads wait on descheduled
    # ones, so PASSIVE wins on latency too.
    trials = [trial(0, 23.3, 11.6), trial(10_000, 68.6, 39.3), trial(300_000, 64.7, 99.6)]
    assert choose(trials, default_threads=2).spin == 0


def test_an_unbounded_spin_wins_only_when_nothing_else_is_fast() -> None:
    trials = [trial(0, 12.0, 9.0), trial(100_000, 10.0, 10.0), trial(300_000, 7.0, 20.0)]
    assert choose(trials, default_threads=2).spin == 300_000


def test_fewer_threads_are_chosen_and_set_only_when_they_win() -> None:
    trials = [
        trial(0, p50_ms=9.0, cpu_ms=9.0, threads=4),
        trial(0, p50_ms=9.1, cpu_ms=6.0, threads=2),
    ]
    choice = choose(trials, default_threads=4)
    assert choice.threads == 2
    assert choice.environment() == {"GOMP_SPINCOUNT": "0", "OMP_NUM_THREADS": "2"}


def test_the_least_spin_wins_even_where_a_longer_one_measured_less_cpu() -> None:
    # What a 2-CPU machine measured (issue 29): the CPU per gapped pass could not tell the spins
    # apart, and the least of it fell to libgomp's own 300,000; the least spin fast enough wins.
    trials = [
        trial(0, p50_ms=5.89, cpu_ms=8.85),
        trial(10_000, p50_ms=4.75, cpu_ms=11.18),
        trial(100_000, p50_ms=6.87, cpu_ms=11.36),
        trial(300_000, p50_ms=4.61, cpu_ms=11.01),
    ]
    assert choose(trials, default_threads=2).spin == 10_000


def test_fast_enough_is_within_ten_percent_of_the_fastest() -> None:
    within = [trial(0, p50_ms=10.9, cpu_ms=9.0), trial(300_000, p50_ms=10.0, cpu_ms=12.0)]
    assert choose(within, default_threads=2).spin == 0
    past = [trial(0, p50_ms=11.2, cpu_ms=9.0), trial(300_000, p50_ms=10.0, cpu_ms=12.0)]
    assert choose(past, default_threads=2).spin == 300_000


def test_among_the_same_spin_the_least_cpu_wins() -> None:
    trials = [trial(10_000, 8.0, 9.5, threads=2), trial(10_000, 8.2, 7.0, threads=1)]
    assert choose(trials, default_threads=2).threads == 1


def test_ties_go_to_less_spin() -> None:
    trials = [trial(100_000, 8.0, 9.0), trial(10_000, 8.0, 9.0)]
    assert choose(trials, default_threads=2).spin == 10_000


def test_no_trial_is_no_choice() -> None:
    with pytest.raises(ValueError, match="no calibration trial"):
        choose([], default_threads=2)


def test_a_choice_survives_its_cache_file_and_fits_the_evidence_bounds() -> None:
    trials = [trial(spin, 8.123456, 9.87654, threads) for spin in (0, 10_000, 100_000, 300_000)
              for threads in (16, 8)]  # fmt: skip
    choice = choose(trials, default_threads=16)
    assert Choice.from_json(choice.to_json()) == choice
    evidence = choice.evidence()
    assert evidence["host_cpu"] == "GOMP_SPINCOUNT=0 threads=16"
    # LoadEvidence.runtime_versions values are bounded to 256 characters by the control plane.
    assert all(len(value) <= 256 for value in evidence.values())
    assert "300000x8:8.12/9.88" in evidence["host_cpu_trials"]


def test_what_the_operator_set_is_theirs() -> None:
    assert operator_chose({"OMP_WAIT_POLICY": "ACTIVE"})
    assert operator_chose({"GOMP_SPINCOUNT": "0"})
    assert not operator_chose({"OMP_NUM_THREADS": "4", "PATH": "/bin"})


def test_thread_candidates_are_torchs_own_and_half() -> None:
    assert thread_candidates(8) == [8, 4]
    assert thread_candidates(1) == [1]


def test_the_cache_is_per_interpreter_and_machine() -> None:
    one = cache_name("/venv/bin/python", ["Xeon", "2", "1"])
    assert one == cache_name("/venv/bin/python", ["Xeon", "2", "1"])
    assert one != cache_name("/other/bin/python", ["Xeon", "2", "1"])
    assert one != cache_name("/venv/bin/python", ["Xeon", "16", "1"])


def test_a_choice_is_kept_only_where_other_work_left_the_cpus_to_the_trials() -> None:
    # 10 s on 2 CPUs: the machine busy 12 CPU-seconds, 9 of them the trials' own.
    share = others_share(machine_busy_s=12.0, own_cpu_s=9.0, elapsed_s=10.0, cpus=2)
    assert share == pytest.approx(0.15)
    assert worth_keeping(share)
    # A compile beside them: both CPUs busy throughout, the trials' own 9 of the 20.
    share = others_share(machine_busy_s=20.0, own_cpu_s=9.0, elapsed_s=10.0, cpus=2)
    assert share == pytest.approx(0.55)
    assert not worth_keeping(share)
    assert worth_keeping(QUIET_SHARE) and not worth_keeping(QUIET_SHARE + 0.01)
    # The trials' own CPU counted past the machine's (the two read at different instants).
    assert others_share(machine_busy_s=8.0, own_cpu_s=9.0, elapsed_s=10.0, cpus=2) == 0.0
    assert others_share(machine_busy_s=8.0, own_cpu_s=0.0, elapsed_s=0.0, cpus=2) == 0.0

"""The probe's worst-case pass as the child runs it (`probe_evidence.run_worst_case`): run only
after a passing health check, named in the evidence, and a failure of it (CUDA out of memory
included) fails the model's check rather than the child. The adapters are stand-ins: no model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gantry.v1 import common_pb2
from gantry.worker.model_host.adapters.base import ForwardCheck, ModelAdapter, WorstCase
from gantry.worker.model_host.probe_evidence import run_worst_case

PASSED = ForwardCheck(shape=(1, 4), finite=True, seconds=0.01, detail="one finite row")


class StandIn(ModelAdapter):
    """An adapter whose worst case is what the test sets: a result, None, or an exception."""

    name = "stand_in"
    task = "embedding"
    serves = frozenset({"embed"})

    def __init__(self, worst: tuple[ForwardCheck, WorstCase] | Exception | None) -> None:
        super().__init__()
        self._worst = worst
        self.worst_cases_run = 0

    def _load(self, model_directory: Path, settings: common_pb2.AdapterSettings) -> Any:
        raise NotImplementedError

    def health_check(self) -> ForwardCheck:
        return PASSED

    def worst_case_check(self) -> tuple[ForwardCheck, WorstCase] | None:
        self.worst_cases_run += 1
        if isinstance(self._worst, Exception):
            raise self._worst
        return self._worst


CASE = WorstCase(batch_inputs=8, input_tokens=512, detail="8 inputs of 512 tokens")


def test_a_passing_worst_case_is_named_and_keeps_the_check() -> None:
    worst = ForwardCheck(shape=(8, 4), finite=True, seconds=0.2, detail="8 finite rows")
    check, wire = run_worst_case(StandIn((worst, CASE)), PASSED)
    assert check == PASSED
    assert (wire.ran, wire.batch_inputs, wire.input_tokens, wire.detail) == (
        True,
        8,
        512,
        "8 inputs of 512 tokens",
    )


def test_a_failing_worst_case_fails_the_model_check_naming_what_ran() -> None:
    worst = ForwardCheck(shape=(8, 4), finite=False, seconds=0.2, problem="non-finite")
    check, wire = run_worst_case(StandIn((worst, CASE)), PASSED)
    assert not check.ok
    assert check.problem == "worst-case pass (8 inputs of 512 tokens): non-finite"
    assert wire.ran and wire.batch_inputs == 8


def test_a_worst_case_that_raises_fails_the_check_and_did_not_run() -> None:
    check, wire = run_worst_case(StandIn(RuntimeError("shapes")), PASSED)
    assert check.problem == "worst-case pass failed: RuntimeError: shapes"
    assert (wire.ran, wire.detail) == (False, check.problem)


def test_an_adapter_without_a_worst_case_says_its_peaks_are_the_health_checks() -> None:
    check, wire = run_worst_case(StandIn(None), PASSED)
    assert check == PASSED
    assert not wire.ran
    assert wire.detail == (
        "adapter 'stand_in' has no worst-case pass: the peaks are those of its health check's "
        "one input"
    )


def test_nothing_runs_after_a_failed_health_check() -> None:
    adapter = StandIn(RuntimeError("never"))
    failed = PASSED.failed("probe returned shape ()")
    check, wire = run_worst_case(adapter, failed)
    assert check == failed and adapter.worst_cases_run == 0
    assert (wire.ran, wire.detail) == (False, "not run: the health check failed")


def test_cuda_running_out_of_memory_in_the_worst_case_fails_the_check_not_the_child() -> None:
    import torch

    # The named fake at the torch.cuda boundary: the error torch's allocator raises.
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. (fake)")
    check, wire = run_worst_case(StandIn(oom), PASSED)
    assert check.problem is not None
    assert check.problem.startswith("worst-case pass failed: OutOfMemoryError: CUDA out of memory")
    assert not wire.ran and wire.detail == check.problem

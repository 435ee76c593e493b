"""`gantry up --device` and the runtime environments `up` prints: where the bundled model runs,
decided from what the worker's default environment reports (its profile made on that device:
tests/integration/test_cli_up_device_profile.py)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from gantry.cli import bootstrap
from gantry.cli.errors import CliError
from gantry.cli.main import main
from gantry.cli.state import StatePaths
from gantry.cli.up import UpSettings, child_specs, worker_flags
from gantry.v1 import worker_gateway_pb2


def _environment(device: str, *, available: bool = True) -> worker_gateway_pb2.RuntimeEnvironment:
    return worker_gateway_pb2.RuntimeEnvironment(
        environment_id="", device=device, available=available
    )


@pytest.mark.parametrize(
    ("requested", "reported", "chosen"),
    [
        ("auto", "cpu", "cpu"),
        ("auto", "cuda", "cuda"),
        ("cpu", "cuda", "cpu"),
        ("cuda", "cuda", "cuda"),
        ("cuda:1", "cuda", "cuda:1"),
    ],
)
def test_the_bundled_models_device_follows_the_default_environment(
    requested: str, reported: str, chosen: str
) -> None:
    assert bootstrap.choose_device(requested, _environment(reported)) == chosen


def test_auto_without_any_default_environment_facts_is_the_cpu() -> None:
    assert bootstrap.choose_device("auto", None) == "cpu"
    assert bootstrap.choose_device("auto", _environment("cuda", available=False)) == "cpu"


def test_cuda_asked_of_a_cpu_environment_is_refused_not_run_on_the_cpu() -> None:
    with pytest.raises(CliError) as caught:
        bootstrap.choose_device("cuda:0", _environment("cpu"))
    assert str(caught.value) == (
        "--device cuda:0: the worker's default environment reports device 'cpu', not CUDA;"
        " `--device cpu` (or auto) profiles the bundled model on the CPU"
    )


@pytest.mark.parametrize("text", ["gpu", "cuda:", "cuda:x", "CPU", "cuda:-1", ""])
def test_a_device_that_is_not_one_of_the_choices_is_a_usage_error(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        bootstrap.parse_device(text)


def test_each_runtime_environment_is_one_line_ready_or_why_not() -> None:
    lines = bootstrap.describe_environments(
        [
            worker_gateway_pb2.RuntimeEnvironment(
                environment_id="vision", unavailable_reason="not built; `make vision-env`"
            ),
            worker_gateway_pb2.RuntimeEnvironment(
                environment_id="",
                adapters=["sentence_transformers", "transformers_causal_lm"],
                device="cpu",
                device_name="x86_64",
                available=True,
            ),
        ]
    )
    assert lines == [
        "default: ready (cpu, x86_64): sentence_transformers, transformers_causal_lm",
        "vision: NOT AVAILABLE: not built; `make vision-env`",
    ]


def test_up_help_names_the_device_and_the_workers_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["up", "--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    for flag in ("--device DEVICE", "--max-residents N", "--resource-domain", "--no-warm-pool"):
        assert flag in shown


def test_only_the_worker_flags_given_are_passed_through(tmp_path: Path) -> None:
    settings = UpSettings(
        paths=StatePaths(tmp_path / "state"),
        address="127.0.0.1:1",
        scheduler_address="127.0.0.1:2",
        startup_timeout_s=1.0,
        ready_timeout_s=1.0,
    )
    assert worker_flags(settings) == []
    given = dataclasses.replace(
        settings,
        max_residents=2,
        resource_domains=("host.ram=ram:8GiB", "gpu0.vram=vram:16GiB:1GiB"),
        warm_pool=False,
    )
    assert worker_flags(given) == [
        *("--max-residents", "2"),
        *("--resource-domain", "host.ram=ram:8GiB"),
        *("--resource-domain", "gpu0.vram=vram:16GiB:1GiB"),
        "--no-warm-pool",
    ]
    flags = worker_flags(given)
    assert child_specs(given)["worker"].argv[-len(flags) :] == flags  # no TLS, no metrics


def test_up_refuses_a_bad_resource_domain_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In the worker's own words (the grammar is gantry.common.resource_declaration), exit 1; the
    unit guard would fail this test had `up` started a process."""
    state = str(tmp_path / "state")
    argv = ["--state-dir", state, "up", "--resource-domain", "gpu0.vram=vram:16GiB"]
    assert main([*argv, "--resource-domain", "gpu0.vram=vram:8GiB"]) == 1
    assert capsys.readouterr().err == (
        "error: --resource-domain: --resource-domain gpu0.vram=vram:16GiB, --resource-domain "
        "gpu0.vram=vram:8GiB: the name 'gpu0.vram' is declared twice\n"
    )
    assert not (tmp_path / "state").exists()

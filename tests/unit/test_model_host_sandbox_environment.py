"""A host's environment is an allow-list: the worker's secrets and interpreter knobs stay out."""

from __future__ import annotations

import re
from pathlib import Path

from gantry.worker.model_host.environments import (
    HOST_CPU_DEFAULTS,
    HOST_PATH,
    INHERITED_ENVIRONMENT,
    OFFLINE_ENVIRONMENT,
    host_environment,
)

SECRET_NAME = re.compile(r"TOKEN(?!IZERS)|KEY|CREDENTIAL|SECRET|PASSWORD|PASSWD", re.IGNORECASE)

WORKER_ENVIRONMENT = {
    "GANTRY_OPERATOR_TOKEN": "op_secret",
    "GANTRY_SCHEDULER_TOKEN": "sc_secret",
    "MY_SECRET": "hunter2",
    "AWS_SECRET_ACCESS_KEY": "aws",
    "HTTPS_PROXY": "http://proxy:3128",
    "PYTHONPATH": "/tmp/planted",
    "PYTHONSTARTUP": "/tmp/planted/start.py",
    "LD_PRELOAD": "/tmp/planted/evil.so",
    "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer abc",
    "HF_HUB_OFFLINE": "0",
    "PATH": "/tmp/planted:/usr/bin",
    "HOME": "/root",
    "OMP_NUM_THREADS": "2",
    "LANG": "C.UTF-8",
    "GANTRY_TRACE_FILE": "/tmp/spans.jsonl",
}


def test_only_allow_listed_names_pass_and_the_host_gets_its_own_home_path_and_offline_flags() -> (
    None
):
    private = Path("/tmp/gantry-host-x")
    environment = host_environment(
        WORKER_ENVIRONMENT, private_dir=private, scratch_dir=private / "tmp"
    )

    assert environment == {
        "OMP_NUM_THREADS": "2",
        "LANG": "C.UTF-8",
        "GANTRY_TRACE_FILE": "/tmp/spans.jsonl",
        "PATH": HOST_PATH,
        "HOME": "/tmp/gantry-host-x",
        "TMPDIR": "/tmp/gantry-host-x/tmp",
        "OMP_WAIT_POLICY": "PASSIVE",
        **OFFLINE_ENVIRONMENT,
    }
    assert environment["HF_HUB_OFFLINE"] == "1"  # forced, whatever the worker says


def test_no_inherited_name_could_carry_a_secret_or_steer_the_interpreter() -> None:
    for name in INHERITED_ENVIRONMENT:
        assert not SECRET_NAME.search(name), name
        assert not name.startswith(("PYTHON", "LD_PRELOAD", "LD_AUDIT")), name
    assert not any(SECRET_NAME.search(name) for name in OFFLINE_ENVIRONMENT)
    # Each allow-listed name says why it is there.
    assert all(reason.strip() for reason in INHERITED_ENVIRONMENT.values())


def test_an_empty_worker_environment_still_gives_a_complete_host_environment() -> None:
    environment = host_environment({}, private_dir=Path("/p"), scratch_dir=Path("/p/tmp"))
    assert set(environment) == {"PATH", "HOME", "TMPDIR", *OFFLINE_ENVIRONMENT, *HOST_CPU_DEFAULTS}


def test_idle_cpu_threads_sleep_unless_the_operator_chose_otherwise() -> None:
    private = Path("/p")
    chosen = host_environment({}, private_dir=private, scratch_dir=private / "tmp")
    assert chosen["OMP_WAIT_POLICY"] == "PASSIVE"
    operator = host_environment(
        {"OMP_WAIT_POLICY": "ACTIVE"}, private_dir=private, scratch_dir=private / "tmp"
    )
    assert operator["OMP_WAIT_POLICY"] == "ACTIVE"


def test_the_operators_thread_policy_reaches_the_host() -> None:
    private = Path("/p")
    chosen = host_environment(
        {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"},
        private_dir=private,
        scratch_dir=private / "tmp",
    )
    assert (chosen["OMP_WAIT_POLICY"], chosen["OMP_NUM_THREADS"]) == ("PASSIVE", "1")

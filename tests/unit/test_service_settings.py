"""The services' settings objects: a flag beats its variable, which beats the default; only
declared variables are read; a bad value exits 2 naming the flag or variable it came from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gantry.common.inference_limits import DEFAULT_LIMITS
from gantry.controlplane import main as controlplane_settings
from gantry.scheduler import settings as scheduler_settings
from gantry.scheduler.policy.core import CoreSettings
from gantry.worker import settings as worker_settings

CONTROL_PLANE = ["--scheduler-token-file", "token"]
WORKER = ["--credential-file", "credential", "--artifact-root", "artifacts"]


@pytest.fixture(autouse=True)
def _no_gantry_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("GANTRY_"):
            monkeypatch.delenv(name)


def _refusal(read, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exited:
        read(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


def test_a_flag_beats_its_variable_which_beats_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read = controlplane_settings.read_settings
    assert read(CONTROL_PLANE).http_listen is None
    monkeypatch.setenv("GANTRY_HTTP_LISTEN", "127.0.0.1:8080")
    monkeypatch.setenv("GANTRY_ENDPOINT_KEY_FILE", "endpoint.key")
    from_env = read(CONTROL_PLANE)
    assert from_env.http_listen == "127.0.0.1:8080"
    assert str(from_env.endpoint_key_file) == "endpoint.key"
    flagged = read([*CONTROL_PLANE, "--http-listen", "0.0.0.0:9", "--endpoint-key-file", "k"])
    assert flagged.http_listen == "0.0.0.0:9"
    assert str(flagged.endpoint_key_file) == "k"


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GANTRY_HTTP_LISTEN", "")
    monkeypatch.setenv("GANTRY_ENDPOINT_KEY_FILE", "")
    config = controlplane_settings.read_settings(CONTROL_PLANE)
    assert config.http_listen is None
    assert config.endpoint_key_file is None


def test_only_the_declared_variables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # A field without a variable of its own ignores one spelt like it (DATABASE_URL is common).
    for name in ("listen", "LISTEN", "database_url", "DATABASE_URL", "scheduler", "SCHEDULER"):
        monkeypatch.setenv(name, "from-the-environment")
    config = controlplane_settings.read_settings(CONTROL_PLANE)
    assert config.listen == "127.0.0.1:50051"
    assert config.database_url == "sqlite+aiosqlite:///.gantry/gantry.db"
    assert config.scheduler == "127.0.0.1:50052"


def test_limits_come_from_flags_else_variables_else_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read = controlplane_settings.read_settings
    assert read(CONTROL_PLANE).inference_limits() == DEFAULT_LIMITS
    monkeypatch.setenv("GANTRY_MAX_INPUTS", "12")
    monkeypatch.setenv("GANTRY_MAX_TOKENS", "100")
    limits = read([*CONTROL_PLANE, "--max-inputs", "7"]).inference_limits()
    assert (limits.max_inputs, limits.max_tokens) == (7, 100)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--max-inputs", "0"], {}, "--max-inputs must be between 1 and 4096, not 0"),
        ([], {"GANTRY_MAX_INPUTS": "12x"}, "GANTRY_MAX_INPUTS must be a whole number, not '12x'"),
        (["--heartbeat-interval-s", "0"], {}, "--heartbeat-interval-s must be positive"),
        (["--lease-seconds", "-1"], {}, "--lease-seconds must be positive"),
        ([], {"GANTRY_TLS_CLIENT_CA": "ca.pem"}, "--tls-client-ca needs --tls-cert and --tls-key"),
        (["--tls-cert", "a.pem"], {}, "--tls-cert and --tls-key go together"),
        (
            ["--default-max-tokens", "8000"],
            {},
            "--default-max-tokens (GANTRY_DEFAULT_MAX_TOKENS) must be at most --max-tokens "
            "(GANTRY_MAX_TOKENS): 8000 > 4096",
        ),
        (
            [],
            {"GANTRY_SCHEDULER_TLS_CERT": "c.pem"},
            "a client certificate needs its key, and a key its certificate",
        ),
    ],
)
def test_the_control_plane_names_what_is_wrong(
    argv: list[str],
    env: dict[str, str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    refusal = _refusal(controlplane_settings.read_settings, [*CONTROL_PLANE, *argv], capsys)
    assert refusal == f"gantry controlplane: error: {message}"


def test_the_scheduler_settings_default_to_the_cores() -> None:
    config = scheduler_settings.read_settings(["--service-token-file", "token"])
    assert config.scheduler_settings().core == CoreSettings()
    assert config.server_tls() is None


def test_the_scheduler_reads_its_tls_variables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GANTRY_TLS_KEY", "key.pem")
    refusal = _refusal(scheduler_settings.read_settings, ["--service-token-file", "t"], capsys)
    assert refusal == "gantry scheduler: error: --tls-cert and --tls-key go together"


def test_the_worker_takes_its_supervision_flags_typed(tmp_path: Path) -> None:
    credential = tmp_path / "credential"
    credential.write_text("secret\n")
    config, declared = worker_settings.read_settings(
        [
            *WORKER,
            "--credential-file",
            str(credential),
            "--ping-interval-s",
            "2",
            "--crash-loop-threshold",
            "5",
            "--no-warm-pool",
        ]
    )
    supervision = config.supervision()
    assert (supervision["ping_interval_s"], supervision["crash_loop_threshold"]) == (2.0, 5)
    assert type(supervision["crash_loop_threshold"]) is int
    settings = config.worker_settings(declared)
    assert (settings.ping_interval_s, settings.credential, settings.warm_pool) == (
        2.0,
        "secret",
        False,
    )
    assert config.warm_pool is False
    assert declared is None
    assert config.client_tls() is None


def test_the_worker_reads_its_tls_variables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GANTRY_TLS_SERVER_NAME", "cp.internal")
    config, _ = worker_settings.read_settings(WORKER)
    tls = config.client_tls()
    assert tls is not None and tls.server_name == "cp.internal"
    monkeypatch.setenv("GANTRY_TLS_CLIENT_KEY", "key.pem")
    refusal = _refusal(worker_settings.read_settings, WORKER, capsys)
    assert refusal == (
        "gantry worker: error: a client certificate needs its key, and a key its certificate"
    )


def test_the_logging_variables_reach_setup_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    config = scheduler_settings.read_settings(["--service-token-file", "t"])
    assert config.logging_environment() == {}
    monkeypatch.setenv("GANTRY_LOG_FORMAT", "yaml")  # misspelt: setup_logging warns, as before
    monkeypatch.setenv("GANTRY_LOG_LEVEL", "DEBUG")
    config = scheduler_settings.read_settings(["--service-token-file", "t", "--log-format", "json"])
    assert config.log_format == "json"
    assert config.logging_environment() == {
        "GANTRY_LOG_FORMAT": "yaml",
        "GANTRY_LOG_LEVEL": "DEBUG",
    }


def test_every_tls_file_is_read_at_start_the_servers_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    absent = tmp_path / "absent"
    argv = [
        *CONTROL_PLANE,
        "--tls-cert",
        f"{absent}/cert.pem",
        "--tls-key",
        f"{absent}/key.pem",
        "--scheduler-tls-ca",
        f"{absent}/ca.pem",
    ]
    refusal = _refusal(controlplane_settings.read_settings, argv, capsys)
    assert refusal.startswith(
        f"gantry controlplane: error: cannot read the TLS private key {absent}"
    )
    refusal = _refusal(controlplane_settings.read_settings, argv[:2] + argv[6:], capsys)
    assert refusal.startswith(f"gantry controlplane: error: cannot read the TLS CA {absent}")

"""`gantry up --tls` with stand-in services that serve what they are given: TLS, mTLS.

Run as a script (`python -m tests.integration.test_tls_up ROLE ARGS`) this module is those
stand-ins: test_cli_bootstrap's, with their ports bound with the --tls-* files `up` passed them.
"""

from __future__ import annotations

import argparse
import signal
import stat
import subprocess
import sys
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gantry.cli.main import main
from gantry.common.tls import ServerTls
from tests.integration import test_cli_bootstrap
from tests.integration.test_cli_up import free_port, read_lines, start_up, wait_for_line

REPO_ROOT = Path(__file__).resolve().parents[2]
GRPCURL = REPO_ROOT / ".venv" / "bin" / "grpcurl"
TLS_ROLES = (
    'lambda role, args: [sys.executable, "-m", "tests.integration.test_tls_up", role, *args]'
)


@pytest.mark.timeout(120)
def test_up_with_tls_issues_certificates_and_every_example_works_over_tls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    address = f"127.0.0.1:{free_port()}"
    process = start_up(state, address, f"127.0.0.1:{free_port()}", TLS_ROLES, "--tls")
    stdout, stderr = read_lines(process.stdout), read_lines(process.stderr)
    try:
        banner = "".join(wait_for_line(stdout, "Ctrl-C stops everything."))
        tls = state / "tls"
        for key in ("ca.key", "controlplane.key", "scheduler.key", "scheduler-link.key"):
            assert stat.S_IMODE((tls / key).stat().st_mode) == 0o600, key
        assert stat.S_IMODE(tls.stat().st_mode) == 0o700
        assert f"-cacert {(tls / 'ca.pem').resolve()} {address} list" in banner
        assert "-plaintext" not in banner

        # The CLI finds the local CA by itself, as the banner's examples expect.
        assert main(["--address", address, "--state-dir", str(state), "nodes"]) == 0
        assert "-local" in capsys.readouterr().out
        assert main(["--address", address, "--state-dir", str(state), "embed", "hi"]) == 0
        # Told to trust another CA, it is refused: TLS is really in the way.
        other = tmp_path / "other.pem"
        other.write_bytes((tls / "scheduler-link.pem").read_bytes())
        assert main(["--address", address, "--state-dir", str(state), "--tls-ca", str(other),
                     "nodes"]) == 1  # fmt: skip
        capsys.readouterr()

        if GRPCURL.exists():
            # The README's command, with this test's paths.
            token = (state / "operator.token").read_text().strip()
            listed = subprocess.run(
                [str(GRPCURL), "-cacert", str(tls / "ca.pem"), "-H",
                 f"authorization: Bearer {token}", address, "gantry.v1.ControlPlane/ListNodes"],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            assert listed.returncode == 0, listed.stderr
            assert "-local" in listed.stdout

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    wait_for_line(stderr, "stopped scheduler", timeout_s=10)
    log = (state / "logs" / "scheduler.log").read_text()
    assert "stand-in serving mTLS" in log
    assert "stand-in serving TLS" in (state / "logs" / "controlplane.log").read_text()
    assert "worker trusts" in (state / "logs" / "worker.log").read_text()


@pytest.mark.timeout(120)
def test_up_without_tls_switches_the_cli_back_to_plaintext(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "tls").mkdir(parents=True)
    (state / "tls" / "enabled").write_text("from an earlier `gantry up --tls`\n")
    (state / "tls" / "ca.pem").write_text("not used\n")
    address = f"127.0.0.1:{free_port()}"
    process = start_up(state, address, f"127.0.0.1:{free_port()}", TLS_ROLES)
    stdout = read_lines(process.stdout)
    try:
        banner = "".join(wait_for_line(stdout, "Ctrl-C stops everything."))
        assert "-plaintext" in banner and "-cacert" not in banner
        assert not (state / "tls" / "enabled").exists()
        assert main(["--address", address, "--state-dir", str(state), "nodes"]) == 0
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()


def _tls_of(argv: list[str]) -> ServerTls | None:
    parser = argparse.ArgumentParser()
    for option in ("--tls-cert", "--tls-key", "--tls-client-ca", "--tls-ca"):
        parser.add_argument(option)
    options, _ = parser.parse_known_args(argv)
    if options.tls_ca:
        print(f"worker trusts {options.tls_ca}", flush=True)
    if not options.tls_cert:
        return None
    return ServerTls(
        cert_chain_file=Path(options.tls_cert),
        private_key_file=Path(options.tls_key),
        client_ca_file=Path(options.tls_client_ca) if options.tls_client_ca else None,
    )


def _serve_with(tls: ServerTls | None) -> Any:
    def serve(listen: str, *servicers: Any) -> tuple[grpc.Server, int]:
        if tls is None:
            return original_serve(listen, *servicers)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
        for servicer in servicers:
            if isinstance(servicer, test_cli_bootstrap.FakeControlPlane):
                test_cli_bootstrap.control_plane_pb2_grpc.add_ControlPlaneServicer_to_server(
                    servicer, server
                )
            elif isinstance(servicer, test_cli_bootstrap.FakeInference):
                test_cli_bootstrap.inference_pb2_grpc.add_InferenceServicer_to_server(
                    servicer, server
                )
        # grpcurl learns the methods by reflection, as from the real control plane.
        reflection.enable_server_reflection(
            ["gantry.v1.ControlPlane", "gantry.v1.Inference", reflection.SERVICE_NAME], server
        )
        port = server.add_secure_port(listen, tls.credentials())
        server.start()
        print(f"stand-in serving {'mTLS' if tls.mutual else 'TLS'} on {listen}", flush=True)
        return server, port

    return serve


original_serve = test_cli_bootstrap.serve


if __name__ == "__main__":
    from setproctitle import setproctitle

    setproctitle(f"gantry {sys.argv[1]}")
    test_cli_bootstrap.serve = _serve_with(_tls_of(sys.argv[2:]))
    sys.exit(test_cli_bootstrap._run_fake_role(sys.argv[1], sys.argv[2:]))

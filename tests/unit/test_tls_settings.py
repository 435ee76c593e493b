"""TLS settings from flags and the environment, and what the local CA generator writes."""

from __future__ import annotations

import argparse
import dataclasses
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from gantry.cli.connection import command_tls
from gantry.cli.state import StatePaths
from gantry.cli.up import UpSettings, _child_env, child_specs
from gantry.common.tls import (
    SCHEDULER_CLIENT_TLS,
    ClientTls,
    TlsSettingsError,
    add_client_tls_arguments,
    add_server_tls_arguments,
    client_tls_from,
    create_local_ca,
    issue,
    listener_mode,
    server_tls_from,
)


def server_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_server_tls_arguments(parser)
    return parser.parse_args(argv)


def client_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_client_tls_arguments(parser)
    add_client_tls_arguments(parser, SCHEDULER_CLIENT_TLS)
    return parser.parse_args(argv)


def test_a_server_is_plaintext_until_a_certificate_is_given() -> None:
    assert server_tls_from(server_args(), env={}) is None
    assert listener_mode(None) == "plaintext"


def test_server_flags_win_over_the_environment_and_a_client_ca_means_mtls() -> None:
    env = {"GANTRY_TLS_CERT": "env.pem", "GANTRY_TLS_KEY": "env.key"}
    from_env = server_tls_from(server_args(), env=env)
    assert from_env is not None and from_env.cert_chain_file == Path("env.pem")
    assert listener_mode(from_env) == "TLS"
    flagged = server_tls_from(server_args("--tls-cert", "a.pem", "--tls-client-ca", "ca.pem"), env)
    assert flagged is not None and flagged.cert_chain_file == Path("a.pem")
    assert flagged.private_key_file == Path("env.key")
    assert flagged.mutual and listener_mode(flagged) == "mTLS"


@pytest.mark.parametrize(
    "argv",
    [("--tls-cert", "a.pem"), ("--tls-key", "a.key"), ("--tls-client-ca", "ca.pem")],
)
def test_half_a_server_setting_is_an_error(argv: tuple[str, ...]) -> None:
    with pytest.raises(TlsSettingsError):
        server_tls_from(server_args(*argv), env={})


def test_client_settings_come_from_flags_or_their_own_environment_variables() -> None:
    assert client_tls_from(client_args(), env={}) is None
    worker = client_tls_from(client_args(), env={"GANTRY_TLS_CA": "ca.pem"})
    assert worker == ClientTls(ca_file=Path("ca.pem"))
    # The scheduler link reads its own variables, not the worker's.
    assert client_tls_from(client_args(), SCHEDULER_CLIENT_TLS, env={"GANTRY_TLS_CA": "x"}) is None
    link = client_tls_from(
        client_args("--scheduler-tls-cert", "c.pem", "--scheduler-tls-key", "c.key"),
        SCHEDULER_CLIENT_TLS,
        env={"GANTRY_SCHEDULER_TLS_CA": "ca.pem"},
    )
    assert link == ClientTls(
        ca_file=Path("ca.pem"), cert_file=Path("c.pem"), key_file=Path("c.key")
    )
    named = client_tls_from(client_args("--tls-server-name", "cp.internal"), env={})
    assert named is not None and named.channel_options() == (
        ("grpc.ssl_target_name_override", "cp.internal"),
    )
    with pytest.raises(TlsSettingsError):
        client_tls_from(client_args("--tls-cert", "c.pem"), env={})


def test_an_unreadable_file_is_named_when_credentials_are_built(tmp_path: Path) -> None:
    with pytest.raises(TlsSettingsError, match=r"missing\.pem"):
        ClientTls(ca_file=tmp_path / "missing.pem").credentials()


def test_the_local_ca_signs_server_and_client_certificates_with_private_keys(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "tls"
    ca = create_local_ca(directory)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    server = issue(directory, "controlplane", ["cp.internal", "10.0.0.7"])
    client = issue(directory, "worker", client=True)
    for key in (ca.key_file, server.key_file, client.key_file):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    ca_cert = x509.load_pem_x509_certificate(ca.cert_file.read_bytes())
    assert ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    server_cert = x509.load_pem_x509_certificate(server.cert_file.read_bytes())
    server_cert.verify_directly_issued_by(ca_cert)
    sans = server_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {"localhost", "cp.internal"}
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {
        "127.0.0.1",
        "10.0.0.7",
    }
    usage = server_cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    client_cert = x509.load_pem_x509_certificate(client.cert_file.read_bytes())
    client_cert.verify_directly_issued_by(ca_cert)
    usage = client_cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_cli_commands_use_the_local_ca_only_while_up_serves_tls(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path / "state")
    paths.create()
    no_flags = argparse.Namespace()
    assert command_tls(no_flags, paths, env={}) is None
    create_local_ca(paths.tls)
    assert command_tls(no_flags, paths, env={}) is None  # a CA alone: up may serve plaintext
    paths.tls_enabled.write_text("yes\n")
    assert command_tls(no_flags, paths, env={}) == ClientTls(ca_file=paths.tls_ca)
    # An explicit CA (flag or environment) wins over the local one.
    chosen = command_tls(no_flags, paths, env={"GANTRY_TLS_CA": "/etc/gantry/ca.pem"})
    assert chosen == ClientTls(ca_file=Path("/etc/gantry/ca.pem"))


def test_up_with_tls_passes_each_child_its_certificates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GANTRY_TLS_CA", "/somewhere/else.pem")
    paths = StatePaths(tmp_path / "state")
    settings = UpSettings(
        paths=paths,
        address="127.0.0.1:50051",
        scheduler_address="127.0.0.1:50052",
        startup_timeout_s=1,
        ready_timeout_s=1,
        tls=True,
    )
    tls = str(paths.tls.resolve())
    specs = child_specs(settings)
    scheduler = " ".join(specs["scheduler"].argv)
    assert f"--tls-cert {tls}/scheduler.pem --tls-key {tls}/scheduler.key" in scheduler
    assert f"--tls-client-ca {tls}/ca.pem" in scheduler
    controlplane = " ".join(specs["controlplane"].argv)
    assert f"--tls-cert {tls}/controlplane.pem" in controlplane
    assert "--tls-client-ca" not in controlplane  # operators and clients carry no certificate
    assert f"--scheduler-tls-cert {tls}/scheduler-link.pem" in controlplane
    assert f"--tls-ca {tls}/ca.pem" in " ".join(specs["worker"].argv)
    # The caller's TLS variables do not leak into the children.
    assert "GANTRY_TLS_CA" not in _child_env()
    plaintext = child_specs(dataclasses.replace(settings, tls=False))
    assert not [
        arg
        for spec in plaintext.values()
        for arg in spec.argv
        if arg.startswith(("--tls", "--scheduler-tls"))
    ]

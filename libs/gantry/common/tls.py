"""TLS for every Gantry channel: server and client settings, gRPC credentials, and a local CA.

A server with a client CA requires a client certificate signed by it (mTLS). There is no
"verify if presented" mode: gRPC's REQUEST_CLIENT_CERTIFICATE_AND_VERIFY let a certificate from
another CA through in our tests, so a half-way mode would only look like security.
Settings come from flags first, then `GANTRY_TLS_*` environment variables; no file is read until
credentials are built, so a bad path fails at start with the path in the message.

`create_local_ca`/`issue` make the certificates `gantry up --tls` uses: ECDSA P-256, private keys
written 0600, server certificates for 127.0.0.1 and localhost (plus any names asked for).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

# Servers: their certificate chain and key; a client CA turns on client certificate checks.
CERT_ENV = "GANTRY_TLS_CERT"
KEY_ENV = "GANTRY_TLS_KEY"
CLIENT_CA_ENV = "GANTRY_TLS_CLIENT_CA"
# Clients: the CA that signed the server, optionally their own certificate and a name override.
CA_ENV = "GANTRY_TLS_CA"
CLIENT_CERT_ENV = "GANTRY_TLS_CLIENT_CERT"
CLIENT_KEY_ENV = "GANTRY_TLS_CLIENT_KEY"
SERVER_NAME_ENV = "GANTRY_TLS_SERVER_NAME"
# The control plane's link to the scheduler is a client with its own settings.
SCHEDULER_CA_ENV = "GANTRY_SCHEDULER_TLS_CA"
SCHEDULER_CERT_ENV = "GANTRY_SCHEDULER_TLS_CERT"
SCHEDULER_KEY_ENV = "GANTRY_SCHEDULER_TLS_KEY"
SCHEDULER_SERVER_NAME_ENV = "GANTRY_SCHEDULER_TLS_SERVER_NAME"

CA_VALIDITY = dt.timedelta(days=3650)
LEAF_VALIDITY = dt.timedelta(days=397)


class TlsSettingsError(ValueError):
    """TLS settings that cannot work (a certificate without its key, an unreadable file)."""


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsSettingsError(f"cannot read the {what} {path}: {exc.strerror}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerTls:
    cert_chain_file: Path
    private_key_file: Path
    client_ca_file: Path | None = None  # set: mTLS, every caller needs a certificate from it

    @property
    def mutual(self) -> bool:
        return self.client_ca_file is not None

    def credentials(self) -> grpc.ServerCredentials:
        key = _read(self.private_key_file, "TLS private key")
        chain = _read(self.cert_chain_file, "TLS certificate chain")
        client_ca = (
            _read(self.client_ca_file, "TLS client CA") if self.client_ca_file is not None else None
        )
        return grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientTls:
    ca_file: Path | None = None  # None: the system's trust roots
    cert_file: Path | None = None  # with key_file: a client certificate (mTLS)
    key_file: Path | None = None
    server_name: str | None = None  # verify the server as this name instead of the address host

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise TlsSettingsError("a client certificate needs its key, and a key its certificate")

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "TLS CA") if self.ca_file else None,
            private_key=_read(self.key_file, "TLS client key") if self.key_file else None,
            certificate_chain=_read(self.cert_file, "TLS client certificate")
            if self.cert_file
            else None,
        )

    def channel_options(self) -> tuple[tuple[str, Any], ...]:
        if self.server_name is None:
            return ()
        return (("grpc.ssl_target_name_override", self.server_name),)


def listener_mode(tls: ServerTls | None) -> str:
    """How a server's port is secured, for its start-up log line."""
    if tls is None:
        return "plaintext"
    return "mTLS" if tls.mutual else "TLS"


# ---- settings from flags and the environment ---------------------------------------------------


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _pick(flag: str | None, env: Mapping[str, str], name: str) -> str | None:
    return flag or env.get(name) or None


def add_server_tls_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS of this server (plaintext unless --tls-cert is given)")
    group.add_argument("--tls-cert", metavar="PEM", help=f"certificate chain (env {CERT_ENV})")
    group.add_argument("--tls-key", metavar="PEM", help=f"private key (env {KEY_ENV})")
    group.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        help="mTLS: refuse every caller without a client certificate from this CA"
        f" (env {CLIENT_CA_ENV})",
    )


def server_tls_from(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> ServerTls | None:
    """The server settings from `add_server_tls_arguments` flags, else the environment."""
    env = os.environ if env is None else env
    return server_tls_of(
        cert=_pick(args.tls_cert, env, CERT_ENV),
        key=_pick(args.tls_key, env, KEY_ENV),
        client_ca=_pick(args.tls_client_ca, env, CLIENT_CA_ENV),
    )


def server_tls_of(*, cert: str | None, key: str | None, client_ca: str | None) -> ServerTls | None:
    """A server's TLS from its chosen values (flag, else environment); None (plaintext) when
    neither certificate nor key is set. Raises TlsSettingsError when they do not go together."""
    if cert is None and key is None:
        if client_ca is not None:
            raise TlsSettingsError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if cert is None or key is None:
        raise TlsSettingsError("--tls-cert and --tls-key go together")
    return ServerTls(
        cert_chain_file=Path(cert),
        private_key_file=Path(key),
        client_ca_file=_path(client_ca),
    )


@dataclass(frozen=True, slots=True)
class ClientTlsNames:
    """The flags and environment variables of one client's TLS settings."""

    prefix: str  # "--tls" or "--scheduler-tls"
    ca_env: str
    cert_env: str
    key_env: str
    server_name_env: str

    def dest(self, suffix: str) -> str:
        return f"{self.prefix}-{suffix}".removeprefix("--").replace("-", "_")


CLIENT_TLS = ClientTlsNames("--tls", CA_ENV, CLIENT_CERT_ENV, CLIENT_KEY_ENV, SERVER_NAME_ENV)
SCHEDULER_CLIENT_TLS = ClientTlsNames(
    "--scheduler-tls",
    SCHEDULER_CA_ENV,
    SCHEDULER_CERT_ENV,
    SCHEDULER_KEY_ENV,
    SCHEDULER_SERVER_NAME_ENV,
)


class ArgumentDeclarer(Protocol):
    """Where flags are declared: an argparse parser or group, or the CLI's Click-built spec."""

    def add_argument(self, *flags: str, **options: Any) -> Any: ...


def add_client_tls_arguments(
    parser: ArgumentDeclarer,
    names: ClientTlsNames = CLIENT_TLS,
    *,
    peer: str = "the server",
    default: Any = None,
) -> None:
    for suffix, metavar, help_text in (
        ("ca", "PEM", f"verify {peer} with this CA; turns TLS on (env {names.ca_env})"),
        ("cert", "PEM", f"client certificate for mTLS (env {names.cert_env})"),
        ("key", "PEM", f"client certificate's private key (env {names.key_env})"),
        (
            "server-name",
            "NAME",
            f"expect this name in {peer}'s certificate (env {names.server_name_env})",
        ),
    ):
        parser.add_argument(
            f"{names.prefix}-{suffix}", metavar=metavar, default=default, help=help_text
        )


def client_tls_from(
    args: argparse.Namespace,
    names: ClientTlsNames = CLIENT_TLS,
    env: Mapping[str, str] | None = None,
) -> ClientTls | None:
    """Client settings from flags, else the environment; None (plaintext) when none is set."""
    env = os.environ if env is None else env
    ca = _pick(getattr(args, names.dest("ca"), None), env, names.ca_env)
    cert = _pick(getattr(args, names.dest("cert"), None), env, names.cert_env)
    key = _pick(getattr(args, names.dest("key"), None), env, names.key_env)
    server_name = _pick(getattr(args, names.dest("server_name"), None), env, names.server_name_env)
    return client_tls_of(ca=ca, cert=cert, key=key, server_name=server_name)


def client_tls_of(
    *, ca: str | None, cert: str | None, key: str | None, server_name: str | None
) -> ClientTls | None:
    """A client's TLS from its chosen values (flag, else environment); None (plaintext) when
    none is set. Raises TlsSettingsError when a certificate comes without its key."""
    if ca is None and cert is None and key is None and server_name is None:
        return None
    return ClientTls(
        ca_file=_path(ca), cert_file=_path(cert), key_file=_path(key), server_name=server_name
    )


# ---- a local certificate authority -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IssuedFiles:
    cert_file: Path
    key_file: Path


def _write_private_key(path: Path, key: Any) -> None:
    from cryptography.hazmat.primitives import serialization

    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.chmod(temporary, 0o600)  # O_CREAT's mode is filtered by the umask
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _write_certificate(path: Path, certificate: Any) -> None:
    from cryptography.hazmat.primitives import serialization

    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    os.replace(temporary, path)


def create_local_ca(directory: Path, *, common_name: str = "Gantry local CA") -> IssuedFiles:
    """Write `ca.pem` and `ca.key` (0600) into `directory` (0700), replacing any there."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    files = IssuedFiles(cert_file=directory / "ca.pem", key_file=directory / "ca.key")
    _write_private_key(files.key_file, key)
    _write_certificate(files.cert_file, certificate)
    return files


def _san(entry: str) -> Any:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(entry))
    except ValueError:
        return x509.DNSName(entry)


def _key_usage(*, signs_certificates: bool) -> Any:
    """Signatures only; the CA's key also signs certificates and CRLs, a leaf's never."""
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def _load_local_ca(directory: Path) -> tuple[Any, Any]:
    """The certificate and EC private key create_local_ca wrote into `directory`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ca_cert = x509.load_pem_x509_certificate(_read(directory / "ca.pem", "CA certificate"))
    ca_key = serialization.load_pem_private_key(
        _read(directory / "ca.key", "CA private key"), password=None
    )
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TlsSettingsError(f"{directory / 'ca.key'} is not an EC key made by create_local_ca")
    return ca_cert, ca_key


def _leaf_certificate(
    name: str, sans: list[str], key: Any, ca_cert: Any, ca_key: Any, *, client: bool
) -> Any:
    """A certificate for `key`, signed by the CA, for client or server authentication only."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + LEAF_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_san(entry) for entry in sans]), critical=False
        )
    return builder.sign(ca_key, hashes.SHA256())


def issue(
    directory: Path,
    name: str,
    sans: tuple[str, ...] | list[str] = (),
    *,
    client: bool = False,
) -> IssuedFiles:
    """Sign `<name>.pem`/`<name>.key` (0600) with the CA in `directory`.

    A server certificate names 127.0.0.1, localhost and `sans`; a client certificate (`client`)
    is for client authentication only and names `name` (and `sans`, if any).
    """
    from cryptography.hazmat.primitives.asymmetric import ec

    ca_cert, ca_key = _load_local_ca(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    names = list(dict.fromkeys(sans if client else ("127.0.0.1", "localhost", *sans)))
    certificate = _leaf_certificate(name, names, key, ca_cert, ca_key, client=client)
    files = IssuedFiles(cert_file=directory / f"{name}.pem", key_file=directory / f"{name}.key")
    _write_private_key(files.key_file, key)
    _write_certificate(files.cert_file, certificate)
    return files

"""What AdoptEndpoint accepts as an external server's address: pure checks, no IO.

The worker on the endpoint's node makes the calls, so the host must be one that names that node
from itself: a loopback address (127.0.0.0/8, ::1, "localhost") or the node's own hostname as its
worker reported it in Hello. Anything else would make a worker a proxy to an arbitrary machine.
No user or password in the URL (a credential travels apart, sealed), no query or fragment, and
no path beyond an optional "/v1": the OpenAI paths (/v1/models, ...) are appended by the worker.
Nor one of this control plane's own listeners (`check_not_own_listener`): a worker calling
Gantry's front door for a deployment Gantry routes back to that worker is a loop.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from dataclasses import dataclass

from gantry.common.errors import GantryError

MAX_URL_CHARS = 2048
MAX_MODEL_CHARS = 256
MAX_CREDENTIAL_CHARS = 4096
_SCHEMES = ("http", "https")
_BASE_PATHS = ("", "/", "/v1", "/v1/")
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, kw_only=True)
class EndpointUrl:
    """A checked base URL, normalised: scheme://host[:port] with no trailing path or slash."""

    scheme: str
    host: str
    port: int | None

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = f":{self.port}" if self.port is not None else ""
        return f"{self.scheme}://{host}{port}"

    @property
    def effective_port(self) -> int:
        return self.port if self.port is not None else _DEFAULT_PORTS[self.scheme]


@dataclass(frozen=True, kw_only=True)
class OwnListeners:
    """Where this control plane listens: the ports it bound (gRPC with the Open Inference
    Protocol, its health port, the OpenAI HTTP door) and its machine's hostname, as a worker
    there reports its own (socket.gethostname())."""

    ports: frozenset[int] = frozenset()
    hostname: str = ""


def _refused(message: str, field: str = "url", **metadata: str) -> GantryError:
    return GantryError("INVALID_ARGUMENT", message, field=field, **metadata)


def is_loopback_host(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def check_endpoint_url(url: str, *, node_hostname: str) -> EndpointUrl:
    """The URL as a base the worker may call, or INVALID_ARGUMENT naming what is wrong (the
    message never repeats a password the URL carried)."""
    if not url:
        raise _refused("url is required: the server's base URL, e.g. http://127.0.0.1:8000")
    if len(url) > MAX_URL_CHARS or any(ch.isspace() or ord(ch) < 0x20 for ch in url):
        raise _refused(f"url must be at most {MAX_URL_CHARS} characters without whitespace")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise _refused(f"url is not a URL: {exc}") from None
    if parts.scheme.lower() not in _SCHEMES:
        raise _refused("url must start with http:// or https://")
    if parts.username is not None or parts.password is not None:
        # Said without echoing the URL: it holds a secret.
        raise _refused(
            "url must not carry a user or password; give the server's token as the credential"
        )
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):
        raise _refused("url must have no query or fragment")
    if parts.path not in _BASE_PATHS:
        raise _refused(f"url must have no path but an optional /v1 (got {parts.path!r})")
    host = (parts.hostname or "").lower()
    if not host:
        raise _refused("url has no host")
    own = node_hostname.lower()
    if not is_loopback_host(host) and (not own or host != own):
        raise _refused(
            f"url host {host!r} is neither loopback nor the node's own hostname "
            f"({node_hostname or 'not reported yet'}): the node's worker calls the server, "
            "and only on its own machine",
            host=host,
        )
    return EndpointUrl(scheme=parts.scheme.lower(), host=host, port=port)


def check_model_name(model: str) -> str:
    if not model:
        raise _refused("model is required: the name the server lists at GET /v1/models", "model")
    if len(model) > MAX_MODEL_CHARS or any(ord(ch) < 0x20 for ch in model):
        raise _refused(f"model must be at most {MAX_MODEL_CHARS} printable characters", "model")
    return model


def check_credential(credential: str) -> str:
    """A bearer token goes into an HTTP header: printable ASCII without spaces, bounded."""
    if len(credential) > MAX_CREDENTIAL_CHARS:
        raise _refused(
            f"credential must be at most {MAX_CREDENTIAL_CHARS} characters", "credential"
        )
    if any(not (0x21 <= ord(ch) <= 0x7E) for ch in credential):
        raise _refused("credential must be printable ASCII without spaces", "credential")
    return credential


def check_not_own_listener(url: EndpointUrl, *, node_hostname: str, own: OwnListeners) -> None:
    """INVALID_ARGUMENT when `url` (already checked: loopback or the node's own hostname) names
    one of this control plane's listeners. The URL reaches the node's machine; that machine is
    this control plane's unless the node reported a hostname and it is another one, so a node
    that has not reported one yet is taken as here. Any address the listener is bound to counts
    (a port on another of this machine's interfaces is refused too): refusing an unusual but
    honest setup costs a port change, adopting ourselves costs a loop."""
    port = url.effective_port
    if port not in own.ports:
        return
    elsewhere = bool(node_hostname) and bool(own.hostname)
    if elsewhere and node_hostname.lower() != own.hostname.lower():
        return
    raise _refused(
        f"url {url.base} is this control plane's own listener (port {port}) on the node's "
        "machine: Gantry does not adopt its own front doors",
        port=str(port),
    )

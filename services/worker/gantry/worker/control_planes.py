"""Which control-plane replicas a worker holds a stream to, from its `--control-plane` text.

Three forms (`parse_control_planes`, pure):

- one address as it is (`host:port`, `ipv4:...`, `unix:...`): one stream, dialled as given, the
  worker of one control plane. A name that resolves to several addresses is still ONE stream
  here (gRPC dials one of them): two streams of one worker to the same replica would take the
  node from each other, so only the forms below open several;
- a comma-separated list (`a:50051,b:50051`): one stream per entry, each dialled as given;
- one DNS name spelt `dns:///name:port`: one stream per address the name resolves to, resolved
  at start and again every `resolve_interval_s` (a replica added or gone is followed), each
  dialled by its IP with the name as its authority (what TLS verifies).

`plan_streams` turns a parsed form and what the resolver found into the stream targets (pure);
the resolving itself is `gantry.common.client_config.resolve_hosts`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gantry.common.client_config import host_and_port, split_addresses
from gantry.common.errors import GantryError

DNS_SCHEME = "dns:"


@dataclass(frozen=True, slots=True)
class StreamTarget:
    """What one stream dials, and the authority it names (None: the address's own)."""

    address: str
    authority: str | None = None


@dataclass(frozen=True, slots=True)
class ControlPlanes:
    """The parsed `--control-plane`: fixed targets, or a DNS name (`host`, `port`) to resolve."""

    fixed: tuple[StreamTarget, ...] = ()
    host: str = ""
    port: int = 0

    @property
    def resolves(self) -> bool:
        """Whether the targets come from resolving a name (again, every interval)."""
        return bool(self.host)


def parse_control_planes(text: str) -> ControlPlanes:
    """The worker's `--control-plane` text, checked; INVALID_ARGUMENT when it is malformed."""
    text = text.strip()
    if text.startswith(DNS_SCHEME):
        # dns:///name:port, or dns://resolver/name:port (gRPC's form; the resolver is ignored).
        rest = text[len(DNS_SCHEME) :]
        name = rest.lstrip("/") if not rest.startswith("//") else rest[2:].partition("/")[2]
        host, port = host_and_port(name)
        return ControlPlanes(host=host, port=port)
    addresses = split_addresses(text)
    if len(addresses) == 1:
        return ControlPlanes(fixed=(StreamTarget(addresses[0]),))
    for address in addresses:
        host_and_port(address)  # each entry of a list names its own port
    if len(set(addresses)) != len(addresses):
        raise GantryError(
            "INVALID_ARGUMENT",
            f"{text!r} names one address twice: two streams to one replica would take the node "
            "from each other",
            field="control_plane",
        )
    return ControlPlanes(fixed=tuple(StreamTarget(address) for address in addresses))


def plan_streams(
    planes: ControlPlanes, resolved: Mapping[str, Sequence[str]]
) -> tuple[StreamTarget, ...]:
    """The streams to hold: the fixed ones, or one per address the name resolved to (`resolved`:
    host → IPs, as `resolve_hosts` returns), in the resolver's order, each IP once."""
    if not planes.resolves:
        return planes.fixed
    authority = f"{planes.host}:{planes.port}"
    targets: list[StreamTarget] = []
    for ip in dict.fromkeys(resolved.get(planes.host, ())):
        host = f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip
        targets.append(StreamTarget(f"{host}:{planes.port}", authority=authority))
    return tuple(targets)

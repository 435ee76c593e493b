"""A managed server's port and where it listens: allocated on loopback, checked with psutil.

The check is a pure function over the listening sockets found (`beyond_loopback`);
`server_listeners` is the thin reader behind it: psutil lists the server's process tree
(`children(recursive=True)`) and each member's own TCP sockets (`net_connections`, which matches
the socket table's inodes against that process's descriptors, so another process's socket in the
same network namespace is never counted as the server's).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psutil

from gantry.common.errors import GantryError
from gantry.worker.managed_server.kinds import LOOPBACK_HOST

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, kw_only=True)
class ListeningSocket:
    address: IPAddress
    port: int

    def describe(self) -> str:
        host = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        return f"{host}:{self.port}"


def listening_of(connections: Iterable[Any]) -> list[ListeningSocket]:
    """The listening sockets among one process's TCP connections (psutil's `pconn` rows: `laddr`
    as (ip, port), `status`); a row it cannot read is skipped."""
    listening = []
    for connection in connections:
        if connection.status != psutil.CONN_LISTEN or not connection.laddr:
            continue
        host, port = connection.laddr[0], connection.laddr[1]
        with contextlib.suppress(ValueError):
            # A scoped IPv6 address (fe80::1%eth0) is not loopback either; its scope goes.
            listening.append(
                ListeningSocket(address=ipaddress.ip_address(host.split("%")[0]), port=port)
            )
    return listening


def is_loopback(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def beyond_loopback(listening: Iterable[ListeningSocket]) -> list[ListeningSocket]:
    """The listening sockets bound anywhere but loopback (0.0.0.0 and :: are every address):
    each one is a refusal."""
    return [entry for entry in listening if not is_loopback(entry.address)]


# ---- the thin reader ----------------------------------------------------------------------------


def process_tree_listeners(pid: int) -> list[ListeningSocket]:
    """The listening TCP sockets (IPv4 and IPv6) held by `pid` and its descendants; a member
    that exits, or whose descriptors cannot be read, while they are listed is skipped."""
    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    listening = []
    for member in members:
        with contextlib.suppress(psutil.Error):
            listening += listening_of(member.net_connections(kind="tcp"))
    return listening


def server_listeners(pid: int) -> tuple[list[ListeningSocket], list[ListeningSocket]]:
    """(every listening socket the process tree holds, those beyond loopback)."""
    held = process_tree_listeners(pid)
    return held, beyond_loopback(held)


# ---- the port -----------------------------------------------------------------------------------


def allocate_loopback_port() -> int:
    """A port free on 127.0.0.1 now (the kernel's choice); `check_port_free` runs again just
    before the server starts, and a server that still cannot bind it fails its load."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK_HOST, 0))
        return int(probe.getsockname()[1])


def check_port_free(port: int, *, deployment_id: str) -> None:
    """LOAD_FAILED (refusal PORT_IN_USE) when something holds `port` on loopback (or on every
    address): the server would fail to bind, or worse, share it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As servers bind: a port left in TIME_WAIT by a previous server is free to take.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((LOOPBACK_HOST, port))
        except OSError as exc:
            why = "in use" if exc.errno == errno.EADDRINUSE else str(exc)
            raise GantryError(
                "LOAD_FAILED",
                f"port {port} on {LOOPBACK_HOST} for the managed server of {deployment_id!r} "
                f"is {why}; refusing to start it there",
                deployment_id=deployment_id,
                refusal="PORT_IN_USE",
                port=str(port),
            ) from exc

"""A managed server's port and where it listens: allocated on loopback, checked from /proc.

The check is a pure function over parsed socket tables (`beyond_loopback`); `listening_sockets`
is the thin reader behind it. /proc/<pid>/net/tcp{,6} list every socket of the network namespace,
so a socket is the server's only when its inode is one of the server's open descriptors
(/proc/<pid>/fd -> `socket:[inode]`), for the server and each of its descendants.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gantry.common.errors import GantryError
from gantry.worker.managed_server.kinds import LOOPBACK_HOST

# /proc/net/tcp's `st` column: 0A is TCP_LISTEN (include/net/tcp_states.h).
_TCP_LISTEN = "0A"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, kw_only=True)
class ListeningSocket:
    inode: int
    address: IPAddress
    port: int

    def describe(self) -> str:
        host = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        return f"{host}:{self.port}"


def _address(hex_address: str) -> IPAddress:
    """The kernel prints an address as 32-bit words in host order (little-endian here)."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return ipaddress.IPv4Address(words)
    return ipaddress.IPv6Address(words)


def parse_tcp_table(text: str) -> list[ListeningSocket]:
    """The listening sockets of one /proc/net/tcp or tcp6 table; rows it cannot read are
    skipped (the header, and nothing else in a kernel's own output)."""
    listening = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _TCP_LISTEN:
            continue
        host, _, port = fields[1].partition(":")
        try:
            listening.append(
                ListeningSocket(inode=int(fields[9]), address=_address(host), port=int(port, 16))
            )
        except ValueError:
            continue
    return listening


def socket_inodes(fd_targets: Iterable[str]) -> set[int]:
    """The socket inodes among a process's descriptor link targets (`socket:[12345]`)."""
    inodes = set()
    for target in fd_targets:
        if target.startswith("socket:[") and target.endswith("]"):
            with contextlib.suppress(ValueError):
                inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def is_loopback(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def owned(listening: Iterable[ListeningSocket], inodes: Collection[int]) -> list[ListeningSocket]:
    """The listening sockets the process tree holds."""
    return [entry for entry in listening if entry.inode in inodes]


def beyond_loopback(
    listening: Iterable[ListeningSocket], inodes: Collection[int]
) -> list[ListeningSocket]:
    """The process tree's listening sockets bound anywhere but loopback (0.0.0.0 and :: are
    every address): each one is a refusal."""
    return [entry for entry in owned(listening, inodes) if not is_loopback(entry.address)]


# ---- the thin reader ----------------------------------------------------------------------------


def _descendants(pid: int) -> Iterator[int]:
    """`pid` and its descendants, from /proc/<pid>/task/*/children (the kernel's own list)."""
    seen: set[int] = set()
    pending = [pid]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        yield current
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{current}/task").iterdir():
                with contextlib.suppress(OSError, ValueError):
                    pending.extend(int(c) for c in (task / "children").read_text().split())


def process_tree_inodes(pid: int) -> set[int]:
    """The socket inodes open in `pid` and its descendants (unreadable descriptors skipped:
    one closed while listed)."""
    targets = []
    for member in _descendants(pid):
        fd_dir = Path(f"/proc/{member}/fd")
        with contextlib.suppress(OSError):
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    targets.append(os.readlink(fd))
    return socket_inodes(targets)


def listening_sockets(pid: int) -> list[ListeningSocket]:
    """Every listening TCP socket in `pid`'s network namespace (IPv4 and IPv6)."""
    listening = []
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            listening += parse_tcp_table(Path(f"/proc/{pid}/net/{table}").read_text())
    return listening


def server_listeners(pid: int) -> tuple[list[ListeningSocket], list[ListeningSocket]]:
    """(every listening socket the process tree holds, those beyond loopback)."""
    listening = listening_sockets(pid)
    inodes = process_tree_inodes(pid)
    return owned(listening, inodes), beyond_loopback(listening, inodes)


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

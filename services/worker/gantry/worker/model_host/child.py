"""The model host child process: loads exactly one model and serves it over an inherited socket.

Run as `python -I -m gantry.worker.model_host.child --deployment-id ID --parent-pid PID
--channel-fd FD --private-dir DIR [--inbox-limit N]`, in DIR, with an allow-listed environment.
Only the standard library, protobuf, OpenTelemetry, setproctitle and psutil (its own memory,
`proc_facts`) are imported before the process is hardened; the ML stack is imported after the
offline flags and the network guard are in place, and the model is read only after the process
has entered its sandbox (`sandbox.enter`), where psutil reads only its own /proc/<pid> entries.

A host forked by a warm pool's fork server (`fork_server`) has its imports done already and
enters at `run_host`, the same code from there on.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from google.protobuf.message import DecodeError
from setproctitle import setproctitle

from gantry.common.errors import GantryError
from gantry.common.json_logs import JSON, json_handler, log_format_of
from gantry.common.telemetry import extract_context, flush_tracing, setup_tracing, tracer
from gantry.v1 import model_host_pb2
from gantry.worker.model_host import cuda_oom, hardening, observed, sandbox, testing_hooks
from gantry.worker.model_host.adapters import ForwardCheck, ModelAdapter, adapter_for
from gantry.worker.model_host.adapters.base import RuntimeFacts
from gantry.worker.model_host.environments import OFFLINE_ENVIRONMENT
from gantry.worker.model_host.framing import FrameError, read_frame
from gantry.worker.model_host.inbox import (
    DEFAULT_INBOX_LIMIT,
    Inbox,
    ResponseWriter,
    read_requests,
)
from gantry.worker.model_host.landlock import Isolation
from gantry.worker.model_host.memory_readings import CudaAllocator
from gantry.worker.model_host.probe_evidence import LoadRecord, run_check
from gantry.worker.model_host.proc_facts import rss_bytes_of
from gantry.worker.model_host.span_relay import HostSpanRelay

# Not imported here: `serving` (numpy, whose BLAS pool starts threads at import) and the ML stack.
# Landlock binds only the thread that asks among those already running, so the process must still
# be single-threaded when it enters the sandbox (Landlock, then the seccomp socket filter);
# `sandbox.enter` refuses otherwise.

logger = logging.getLogger("gantry.model_host")

EXIT_LOAD_FAILED = 2
EXIT_PROTOCOL_ERROR = 3


def process_title(deployment_id: str) -> str:
    return f"gantry model-host {deployment_id}"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gantry-model-host")
    parser.add_argument("--deployment-id", required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--private-dir", type=Path, required=True)
    parser.add_argument("--inbox-limit", type=int, default=DEFAULT_INBOX_LIMIT)
    return parser.parse_args(argv)


def _rss_bytes() -> int:
    rss = rss_bytes_of()
    if rss is None:
        # HostReady.rss_bytes cannot say "unavailable": 0 means "not measured", never a peak
        # (ru_maxrss or VmHWM would claim memory the process may no longer hold).
        logger.warning("cannot read this process's VmRSS (psutil); reporting rss_bytes 0")
        return 0
    return rss


def _first_forward_pass(adapter: ModelAdapter) -> ForwardCheck:
    """The load's health check: a real forward pass must give finite output of the right shape."""
    # A CUDA OOM here is raised: the envelope cannot run even the probe input (RUNTIME_OOM).
    check = run_check(adapter, oom_raises=True)
    if not check.ok:
        raise GantryError("HEALTH_FAILED", f"health probe at load: {check.problem}")
    return check


def _enter_sandbox(load: model_host_pb2.HostLoad, private_dir: Path) -> Isolation:
    """Confine this process before the model is read; refuse when below what the worker needs."""
    isolation = sandbox.enter(
        model_directory=Path(load.model_directory),
        private_dir=private_dir,
        device=load.adapter.device or "cpu",
    )
    logger.info("isolation %s: %s", isolation.wire, isolation.reason)
    try:
        required = sandbox.parse_required(load.require_isolation)
    except ValueError as exc:
        raise GantryError("RUNTIME_ENVIRONMENT_UNAVAILABLE", str(exc)) from exc
    refusal = sandbox.shortfall(required, isolation)
    if refusal is not None:
        raise refusal
    return isolation


def _load_model(adapter: ModelAdapter, load: model_host_pb2.HostLoad) -> RuntimeFacts:
    facts = adapter.load(Path(load.model_directory), load.adapter)
    if testing_hooks.enabled() and load.deployment_id == testing_hooks.CUDA_OOM_AT_LOAD_DEPLOYMENT:
        # The fake at the torch.cuda boundary, raised where a real one would be: the model's
        # memory is taken when the allocator gives up.
        raise testing_hooks.fake_cuda_oom()
    return facts


def _freeze_loaded_model() -> None:
    """Collect the load's garbage once, then put what remains (the model's objects, which live
    as long as the host) out of the cyclic collector's reach: no later full collection traverses
    them, which in a forked host would also copy the pages they share with the fork server."""
    gc.collect()
    gc.freeze()


def _load_failure(exc: Exception, cuda: CudaAllocator | None, device: str) -> GantryError:
    """A failed load's typed error: a CUDA allocator that could not fit the model (its load or
    its first forward pass) is RUNTIME_OOM, with the figures it measured."""
    if isinstance(exc, GantryError):
        return exc
    if cuda_oom.is_cuda_oom(exc):
        return cuda_oom.load_oom(exc, cuda or CudaAllocator(device))
    return GantryError("LOAD_FAILED", f"loading the model failed: {exc!r}")


def _load_and_report(
    request: model_host_pb2.HostRequest, writer: ResponseWriter, private_dir: Path
) -> tuple[ModelAdapter, LoadRecord, model_host_pb2.HostReady] | None:
    """Sandbox, load, health-check and answer the load request; None after answering a failure."""
    load = request.load
    started = time.monotonic()
    cuda: CudaAllocator | None = None
    with tracer("gantry.model_host").start_as_current_span(
        "model_host.load",
        context=extract_context(request.trace_context),
        attributes={"gantry.deployment_id": load.deployment_id},
    ):
        try:
            adapter = adapter_for(load.adapter.adapter)
            # From here on the weight files this process opens are seen (observed.py).
            observed.install(Path(load.model_directory))
            isolation = _enter_sandbox(load, private_dir)
            # Read before the model exists (torch, for a CUDA device, is imported only now).
            cuda = CudaAllocator(load.adapter.device or "cpu")
            cuda_before = cuda.allocated()
            facts = _load_model(adapter, load)
            cuda_after, cuda_reserved = cuda.allocated(), cuda.reserved()
            check = _first_forward_pass(adapter)
            _freeze_loaded_model()
            record = LoadRecord(
                isolation=isolation,
                model_directory=Path(load.model_directory),
                cuda=cuda,
                cuda_allocated_before_load=cuda_before,
                cuda_allocated_after_load=cuda_after,
                cuda_reserved_after_load=cuda_reserved,
                first_invoke_seconds=check.seconds,
            )
            ready = model_host_pb2.HostReady(
                pid=os.getpid(),
                load_seconds=time.monotonic() - started,
                dim=adapter.dim,
                rss_bytes=_rss_bytes(),
                runtime_versions=facts.versions,
                isolation=isolation.wire,
                isolation_reason=isolation.reason,
            )
        except Exception as exc:
            error = _load_failure(exc, cuda, load.adapter.device or "cpu")
            logger.exception("model load failed")
            writer.fail(request, error)
            return None
    writer.send(model_host_pb2.HostResponse(request_id=request.request_id, ready=ready))
    return adapter, record, ready


@dataclass(frozen=True, kw_only=True)
class HostArguments:
    """What a host is told at start: its command line when spawned, a fork request when forked."""

    deployment_id: str
    parent_pid: int
    channel_fd: int
    private_dir: Path
    inbox_limit: int = DEFAULT_INBOX_LIMIT


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    return run_host(
        HostArguments(
            deployment_id=args.deployment_id,
            parent_pid=args.parent_pid,
            channel_fd=args.channel_fd,
            private_dir=args.private_dir,
            inbox_limit=args.inbox_limit,
        )
    )


def run_host(args: HostArguments) -> int:
    """Harden, read the load request, load in the sandbox, serve: the host's life after start,
    the same whether it was spawned (`main`) or forked by a warm pool (`fork_server`)."""
    _harden(args)
    _setup_logging(args.deployment_id)
    channel = socket.socket(fileno=args.channel_fd)
    requests = channel.makefile("rb")
    # Every frame goes through the writer's lock: the span export thread relays spans on this
    # pipe while the main thread answers (the load's answer included).
    writer = ResponseWriter(channel.makefile("wb"))
    # Spans are exported by a thread that starts with the first finished span (after the
    # sandbox, which refuses a second thread), never on the serving loop; OTLP export goes
    # through the worker (span_relay). A normal exit flushes within 2 s; a killed host loses
    # the spans still queued.
    setup_tracing("gantry-model-host", relay=HostSpanRelay(writer.send))
    first = _read_load_request(requests)
    if first is None:
        return EXIT_PROTOCOL_ERROR

    loaded = _load_and_report(first, writer, args.private_dir)
    if loaded is None:
        flush_tracing()
        return EXIT_LOAD_FAILED
    adapter, record, ready = loaded
    logger.info(
        "ready: adapter=%s dim=%d load_seconds=%.2f", adapter.name, ready.dim, ready.load_seconds
    )
    return _serve(args, first.load, adapter, record, requests=requests, writer=writer)


def _harden(args: HostArguments) -> None:
    """What the process does to itself before it reads anything from the worker."""
    hardening.die_with_parent(args.parent_pid)
    setproctitle(process_title(args.deployment_id))
    hardening.redirect_stdout_to_stderr()
    # The parent owns this process's lifetime; a terminal's Ctrl-C is the parent's to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    hardening.apply_environment(OFFLINE_ENVIRONMENT)
    hardening.install_network_guard()


def _setup_logging(deployment_id: str) -> None:
    # The worker's GANTRY_LOG_FORMAT (allow-listed in INHERITED_ENVIRONMENT): one format per node.
    log_format, _ = log_format_of(None, os.environ)
    logging.basicConfig(
        # force: a forked host inherits its fork server's logging setup, never its own.
        force=True,
        level=logging.INFO,
        handlers=[
            json_handler("model-host", fields={"deployment_id": deployment_id})
            if log_format == JSON
            else logging.StreamHandler(sys.stderr)
        ],
        format=f"%(asctime)s %(levelname)s model-host[{deployment_id}] %(name)s: %(message)s",
    )


def _read_load_request(requests: BinaryIO) -> model_host_pb2.HostRequest | None:
    """The first frame, which must be the load request; None (logged) when it is not one."""
    try:
        payload = read_frame(requests)
        first = model_host_pb2.HostRequest.FromString(payload) if payload is not None else None
    except (FrameError, DecodeError, OSError) as exc:
        logger.error("cannot read the load request: %s", exc)
        return None
    if first is None or first.WhichOneof("kind") != "load":
        logger.error("the first frame must be a load request")
        return None
    return first


def _serve(
    args: HostArguments,
    load: model_host_pb2.HostLoad,
    adapter: ModelAdapter,
    record: LoadRecord,
    *,
    requests: BinaryIO,
    writer: ResponseWriter,
) -> int:
    """The serving loop on this thread, fed by a reader thread of the channel; its exit code."""
    from gantry.worker.model_host.pass_lanes import PassLanes
    from gantry.worker.model_host.serving import ModelServer, ServingSettings

    inbox = Inbox(limit=args.inbox_limit)
    done = threading.Event()
    threading.Thread(
        target=read_requests,
        args=(requests, inbox, writer, done),
        name="channel-reader",
        daemon=True,
    ).start()
    server = ModelServer(
        deployment_id=load.deployment_id,
        adapter=adapter,
        record=record,
        settings=ServingSettings.from_adapter(load.adapter),
        inbox=inbox,
        responses=writer,
        lanes=PassLanes.for_adapter(adapter),
    )
    try:
        return server.serve()
    finally:
        done.set()


if __name__ == "__main__":
    sys.exit(main())

"""The model host child process: loads exactly one model and serves it over an inherited socket.

Run as `python -I -m gantry.worker.model_host.child --deployment-id ID --parent-pid PID
--channel-fd FD --private-dir DIR [--inbox-limit N]`, in DIR, with an allow-listed environment.
Only the standard library, protobuf and OpenTelemetry are imported before the process is hardened;
the ML stack is imported after the offline flags and the network guard are in place, and the model
is read only after the process has entered its sandbox (`sandbox.enter`).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from google.protobuf.message import DecodeError
from setproctitle import setproctitle

from gantry.common.errors import GantryError
from gantry.common.telemetry import extract_context, flush_tracing, setup_tracing, tracer
from gantry.v1 import model_host_pb2
from gantry.worker.model_host import hardening, sandbox
from gantry.worker.model_host.environments import OFFLINE_ENVIRONMENT
from gantry.worker.model_host.framing import FrameError, read_frame, write_frame
from gantry.worker.model_host.inbox import (
    DEFAULT_INBOX_LIMIT,
    Inbox,
    ResponseWriter,
    read_requests,
)
from gantry.worker.model_host.landlock import Isolation
from gantry.worker.model_host.proc_facts import rss_bytes_of

# Not imported here: `serving` (numpy, whose BLAS pool starts threads at import) and the ML stack.
# Landlock binds only the thread that asks among those already running, so the process must still
# be single-threaded when it enters the sandbox; `sandbox.enter` refuses otherwise.

logger = logging.getLogger("gantry.model_host")

EXIT_LOAD_FAILED = 2
EXIT_PROTOCOL_ERROR = 3
SUPPORTED_ADAPTERS = ("", "sentence_transformers")


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
        # 0 means "not measured": a peak (ru_maxrss) would claim memory the process may not hold.
        logger.warning("cannot read /proc/self/statm; reporting rss_bytes 0 (unavailable)")
        return 0
    return rss


def _load_model(load: model_host_pb2.HostLoad) -> Any:
    if load.adapter.adapter not in SUPPORTED_ADAPTERS:
        raise GantryError("LOAD_FAILED", f"unsupported adapter {load.adapter.adapter!r}")
    model_directory = Path(load.model_directory)
    if not model_directory.is_dir():
        raise GantryError("LOAD_FAILED", f"model directory {str(model_directory)!r} does not exist")
    # Imported here, after the offline flags and the network guard, never at module import.
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(
        str(model_directory),
        device=load.adapter.device or "cpu",
        local_files_only=True,
        trust_remote_code=False,
    )
    if load.adapter.max_input_length:
        model.max_seq_length = load.adapter.max_input_length
    model.eval()
    return model


def _health_check(model: Any, normalize: bool) -> int:
    """A real forward pass: one probe sentence must give one finite row of the model's width."""
    import numpy as np

    from gantry.worker.model_host.serving import HEALTH_PROBE_TEXT

    try:
        probe = model.encode(
            [HEALTH_PROBE_TEXT],
            convert_to_numpy=True,
            normalize_embeddings=normalize,
            show_progress_bar=False,
        )
    except Exception as exc:
        raise GantryError("HEALTH_FAILED", f"health probe forward pass failed: {exc}") from exc
    if probe.ndim != 2 or probe.shape[0] != 1 or probe.shape[1] == 0:
        raise GantryError("HEALTH_FAILED", f"health probe returned shape {probe.shape}")
    if not np.isfinite(probe).all():
        raise GantryError("HEALTH_FAILED", "health probe returned non-finite values")
    expected_dim = model.get_embedding_dimension()
    if expected_dim and expected_dim != probe.shape[1]:
        raise GantryError(
            "HEALTH_FAILED",
            f"health probe width {probe.shape[1]} != model dimension {expected_dim}",
        )
    return int(probe.shape[1])


def _runtime_versions(model: Any) -> dict[str, str]:
    import sentence_transformers
    import torch
    import transformers

    device = model.device
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = platform.processor() or "cpu"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "device": str(device),
        "device_name": device_name,
    }


def _enter_sandbox(load: model_host_pb2.HostLoad, private_dir: Path) -> Isolation:
    """Confine this process before the model is read; refuse when below what the worker needs."""
    isolation = sandbox.enter(
        model_directory=Path(load.model_directory),
        private_dir=private_dir,
        device=load.adapter.device or "cpu",
    )
    logger.info("isolation %s: %s", isolation.level.name, isolation.reason)
    try:
        required = sandbox.parse_required(load.require_isolation)
    except ValueError as exc:
        raise GantryError("RUNTIME_ENVIRONMENT_UNAVAILABLE", str(exc)) from exc
    refusal = sandbox.shortfall(required, isolation)
    if refusal is not None:
        raise refusal
    return isolation


def _load_and_report(
    request: model_host_pb2.HostRequest, responses: BinaryIO, private_dir: Path
) -> tuple[Any, model_host_pb2.HostReady] | None:
    """Sandbox, load, health-check and answer the load request; None after answering a failure."""
    load = request.load
    started = time.monotonic()
    with tracer("gantry.model_host").start_as_current_span(
        "model_host.load",
        context=extract_context(request.trace_context),
        attributes={"gantry.deployment_id": load.deployment_id},
    ):
        try:
            isolation = _enter_sandbox(load, private_dir)
            model = _load_model(load)
            dim = _health_check(model, load.adapter.normalize)
            ready = model_host_pb2.HostReady(
                pid=os.getpid(),
                load_seconds=time.monotonic() - started,
                dim=dim,
                rss_bytes=_rss_bytes(),
                runtime_versions=_runtime_versions(model),
                isolation=isolation.level.name,
                isolation_reason=isolation.reason,
            )
        except Exception as exc:
            error = (
                exc
                if isinstance(exc, GantryError)
                else GantryError("LOAD_FAILED", f"loading the model failed: {exc!r}")
            )
            logger.exception("model load failed")
            write_frame(
                responses,
                model_host_pb2.HostResponse(
                    request_id=request.request_id, failure=error.to_failure()
                ),
            )
            return None
    write_frame(responses, model_host_pb2.HostResponse(request_id=request.request_id, ready=ready))
    return model, ready


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    hardening.die_with_parent(args.parent_pid)
    setproctitle(process_title(args.deployment_id))
    hardening.redirect_stdout_to_stderr()
    # The parent owns this process's lifetime; a terminal's Ctrl-C is the parent's to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    hardening.apply_environment(OFFLINE_ENVIRONMENT)
    hardening.install_network_guard()
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s model-host[{args.deployment_id}] %(name)s: %(message)s",
    )
    setup_tracing("gantry-model-host", synchronous=True)

    channel = socket.socket(fileno=args.channel_fd)
    requests = channel.makefile("rb")
    responses = channel.makefile("wb")
    try:
        payload = read_frame(requests)
        first = model_host_pb2.HostRequest.FromString(payload) if payload is not None else None
    except (FrameError, DecodeError, OSError) as exc:
        logger.error("cannot read the load request: %s", exc)
        return EXIT_PROTOCOL_ERROR
    if first is None or first.WhichOneof("kind") != "load":
        logger.error("the first frame must be a load request")
        return EXIT_PROTOCOL_ERROR

    loaded = _load_and_report(first, responses, args.private_dir)
    if loaded is None:
        flush_tracing()
        return EXIT_LOAD_FAILED
    model, ready = loaded
    logger.info("ready: dim=%d load_seconds=%.2f", ready.dim, ready.load_seconds)

    from gantry.worker.model_host.serving import EmbedServer, ServingSettings

    inbox = Inbox(limit=args.inbox_limit)
    writer = ResponseWriter(responses)
    done = threading.Event()
    threading.Thread(
        target=read_requests,
        args=(requests, inbox, writer, done),
        name="channel-reader",
        daemon=True,
    ).start()
    server = EmbedServer(
        encoder=model,
        settings=ServingSettings.from_adapter(first.load.adapter),
        inbox=inbox,
        responses=writer,
        expected_dim=ready.dim,
    )
    try:
        return server.serve()
    finally:
        done.set()


if __name__ == "__main__":
    sys.exit(main())

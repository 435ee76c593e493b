"""The fork server process of a warm pool: harden as a host does, import the ML stack, serve.

Run as `python -I -m gantry.worker.model_host.fork_server_main --parent-pid PID --control-fd FD`,
in its own private directory, with the allow-listed environment of the hosts it will fork. It
hardens itself before any import exactly as a host does before its own (offline flags, network
guard, SIGINT ignored, dies with the worker), imports what the adapters import lazily, and runs
no torch op. It must stay single-threaded: `os.fork` copies only the calling thread, and a lock
another thread held at that moment would stay held forever in the host.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping

from setproctitle import setproctitle

from gantry.worker.model_host import fork_server, hardening
from gantry.worker.model_host.environments import OFFLINE_ENVIRONMENT

# numpy's and scipy's OpenBLAS start a thread pool at import unless told otherwise. Hosts forked
# from this server keep the setting: their numpy BLAS is single-threaded (torch's own pools,
# sized by OMP_NUM_THREADS / MKL_NUM_THREADS, are not affected, and still start lazily).
SINGLE_THREADED_LIBRARIES = {"OPENBLAS_NUM_THREADS": "1"}

# What a host imports before and during a load: the child's own modules, then the ML stack the
# adapters import lazily (see model_host/adapters), and the model classes they reach for.
PRELOADED_MODULES = (
    "gantry.worker.model_host.child",
    "gantry.worker.model_host.serving",
    "numpy",
    "torch",
    "transformers",
    "transformers.models.bert.modeling_bert",
)
# Each runtime environment holds the libraries of its adapters only: the default one
# sentence-transformers, an image one torchvision and Pillow (transformers' image processors need
# torchvision, which does not import beside the default environment's torch). A stack is
# preloaded where its first module is installed; a failing import of an installed one is still
# the server's failure.
OPTIONAL_PRELOADS: Mapping[str, tuple[str, ...]] = {
    "sentence_transformers": ("sentence_transformers", "sentence_transformers.cross_encoder"),
    "torchvision": (
        "torchvision",
        "PIL.Image",
        "gantry.worker.model_host.image_decoding",
        "transformers.models.vit.image_processing_vit",
        "transformers.models.vision_encoder_decoder.modeling_vision_encoder_decoder",
        "transformers.models.vit.modeling_vit",
        "transformers.models.trocr.modeling_trocr",
        "transformers.models.trocr.processing_trocr",
        "transformers.models.siglip2.modeling_siglip2",
        "transformers.models.siglip2.image_processing_siglip2",
        "transformers.models.siglip2.processing_siglip2",
    ),
}

logger = logging.getLogger("gantry.fork_server")


def process_title(parent_pid: int) -> str:
    return f"gantry fork-server for {parent_pid}"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gantry-fork-server")
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--control-fd", type=int, required=True)
    return parser.parse_args(argv)


def _preload() -> None:
    for name in PRELOADED_MODULES:
        importlib.import_module(name)
    for stack, modules in OPTIONAL_PRELOADS.items():
        if importlib.util.find_spec(stack) is None:
            continue
        for name in modules:
            importlib.import_module(name)
    if "sentence_transformers" in sys.modules:
        # Attributes sentence_transformers resolves lazily; touching them imports their modules.
        import sentence_transformers

        _ = (sentence_transformers.SentenceTransformer, sentence_transformers.CrossEncoder)
    # transformers >= 5 builds its checkpoint-conversion table (about a thousand regexes, half a
    # second) at a model's first load and keeps it in the module: build it once, here. Pure
    # Python, no torch op; other versions simply lack it.
    try:
        conversion = importlib.import_module("transformers.conversion_mapping")
    except ImportError:
        return
    build_table = getattr(conversion, "get_checkpoint_conversion_mapping", None)
    if callable(build_table):
        build_table("bert")


def _freeze_imports() -> None:
    """Put every object the imports made out of the cyclic collector's reach, for good.

    A forked host shares this heap copy-on-write. Its first full collection would traverse every
    one of these objects and write its GC header, copying most of the heap into the host
    (measured, MiniLM: a further resident's PSS about 165 MiB frozen; unfrozen, 232 MiB once it
    had run one full collection).
    Frozen objects are never traversed, here or in a host, which inherits the freeze.
    """
    gc.collect()
    gc.freeze()


def _running_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    hardening.die_with_parent(args.parent_pid)
    # Before any variable is set: setproctitle finds the argv area by walking back from the
    # first environment string, which setting a variable may move to the heap.
    setproctitle(process_title(args.parent_pid))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    hardening.apply_environment(OFFLINE_ENVIRONMENT)
    hardening.apply_environment(SINGLE_THREADED_LIBRARIES)
    hardening.install_network_guard()
    # Its own handler, not the root's: a forked host configures the root logger itself.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s fork-server: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False

    control = socket.socket(fileno=args.control_fd)
    started = time.monotonic()
    try:
        _preload()
    except Exception as exc:
        logger.exception("fork server: importing the ML stack failed")
        control.send(fork_server.encode_reply(kind="failed", error=f"import failed: {exc!r}"))
        return 1
    threads = _running_threads()
    if threads != 1:
        # Forking now could hand a host a lock some other thread holds: refuse to serve.
        message = f"{threads} threads run after the imports; a fork server must have one"
        logger.error("fork server: %s", message)
        control.send(fork_server.encode_reply(kind="failed", error=message))
        return 1
    _freeze_imports()
    import_seconds = time.monotonic() - started
    logger.info("ready: imports took %.2fs, pid %d", import_seconds, os.getpid())
    control.send(
        fork_server.encode_reply(
            kind="ready", pid=os.getpid(), import_seconds=import_seconds, threads=threads
        )
    )
    return fork_server.serve(control, worker_pid=args.parent_pid)


if __name__ == "__main__":
    exit_code = main()
    # Nothing of the server outlives it but what it wrote: skip the interpreter's teardown of the
    # imported ML stack, seconds spent inside the worker's bounded stop for nothing.
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(exit_code)

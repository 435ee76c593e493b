"""Test hooks of the model host's GPU and evidence paths, on only in hosts a test starts with
`HostLaunchSpec(test_hooks=True)` (which sets TEST_HOOKS_VARIABLE in that child alone; a worker's
environment never passes it on). serving.py holds the older ones (hang, slow, fail).

`fake_cuda_oom` is the named fake at the torch.cuda boundary: the `torch.cuda.OutOfMemoryError`
torch's caching allocator raises, worded as torch 2.x words it, so a CPU-only host takes the
same path a GPU's allocator would send it down. The evidence hooks change what the child then
observes of itself (its environment, its imports, the weight files it read), so a test can show
that the evidence reports it rather than a constant.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gantry.worker.model_host.environments import TEST_HOOKS_VARIABLE

logger = logging.getLogger("gantry.model_host")

# A load for this deployment id raises the fake right after the adapter's load.
CUDA_OOM_AT_LOAD_DEPLOYMENT = "test-hook-cuda-oom-at-load"
# An input equal to one of these: the forward pass raises the fake; or, before it runs normally,
# the child drops HF_HUB_OFFLINE from its environment, imports a module as a trusted model's code
# would be (under transformers_modules, from its scratch directory), or reads a weight file
# outside its verified copy.
CUDA_OOM_INPUT = "__gantry_test_hook__:cuda-oom"
UNSET_HUB_OFFLINE_INPUT = "__gantry_test_hook__:unset-hf-hub-offline"
REMOTE_CODE_INPUT = "__gantry_test_hook__:import-remote-code"
FOREIGN_WEIGHTS_INPUT = "__gantry_test_hook__:read-foreign-weights"

REMOTE_CODE_MODULE = "transformers_modules.gantry_test_hook"
FOREIGN_WEIGHTS_FILE = "gantry-test-hook-foreign.safetensors"
# What the fake says it tried to allocate, and the device it says it ran out on.
FAKE_TRIED_BYTES = 2 * 1024**3
FAKE_TOTAL_BYTES = 80 * 1024**3
FAKE_FREE_BYTES = 512 * 1024**2


def enabled() -> bool:
    return os.environ.get(TEST_HOOKS_VARIABLE) == "1"


def fake_cuda_oom() -> Exception:
    import torch

    logger.warning("test hook: raising a fake torch.cuda.OutOfMemoryError")
    error: Exception = torch.cuda.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "80.00 GiB of which 512.00 MiB is free. Including non-PyTorch memory, this process has "
        "79.50 GiB memory in use. (fake: the gantry model host's test hook)"
    )
    return error


def _import_remote_code() -> None:
    source = Path(os.environ["TMPDIR"]) / "gantry_test_hook_remote_code.py"
    source.write_text("ANSWER = 42\n")
    spec = importlib.util.spec_from_file_location(REMOTE_CODE_MODULE, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[REMOTE_CODE_MODULE] = module


def _read_foreign_weights() -> None:
    path = Path(os.environ["TMPDIR"]) / FOREIGN_WEIGHTS_FILE
    path.write_bytes(b"\0" * 8)
    with open(path, "rb") as weights:
        weights.read()


def apply(inputs: Sequence[str]) -> None:
    """Run the hooks the inputs name; the fake OOM last, after the others took effect."""
    if UNSET_HUB_OFFLINE_INPUT in inputs:
        logger.warning("test hook: unsetting HF_HUB_OFFLINE")
        os.environ.pop("HF_HUB_OFFLINE", None)
    if REMOTE_CODE_INPUT in inputs:
        logger.warning("test hook: importing %s", REMOTE_CODE_MODULE)
        _import_remote_code()
    if FOREIGN_WEIGHTS_INPUT in inputs:
        logger.warning("test hook: reading a weight file outside the verified copy")
        _read_foreign_weights()
    if CUDA_OOM_INPUT in inputs:
        raise fake_cuda_oom()

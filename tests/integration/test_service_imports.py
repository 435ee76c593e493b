"""The control plane and the scheduler import no ML stack: their images stay small."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

ML_MODULES = ("torch", "transformers", "sentence_transformers", "pynvml", "numpy")


@pytest.mark.parametrize(
    "modules",
    [
        ["gantry.controlplane.main", "gantry.controlplane.app"],
        ["gantry.scheduler.main", "gantry.scheduler.server"],
        ["gantry.worker.main", "gantry.worker.agent"],  # the worker parent defers torch to children
    ],
)
def test_service_imports_leave_the_ml_stack_unloaded(modules: list[str]):
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in {ML_MODULES!r} if m in sys.modules)))\n"
    )
    output = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(output.stdout) == []

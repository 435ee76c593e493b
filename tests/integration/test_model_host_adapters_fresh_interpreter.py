"""What a model host's modules do to a fresh interpreter, read from a child process.

Importing the adapter registry and the child pulls in no ML library and starts no thread (the child
enters its single-threaded sandbox after them), and the network guard reports itself installed only
once it is. The adapters themselves are tested in tests/unit/test_model_host_adapters.py; these run
a process, which the unit guard refuses.
"""

from __future__ import annotations

import subprocess
import sys

from gantry.worker.model_host.probe_evidence import network_guard_installed


def test_importing_the_registry_and_child_pulls_in_no_ml_library_or_thread() -> None:
    # The child imports these before it enters its single-threaded sandbox.
    code = (
        "import sys, threading\n"
        "import gantry.worker.model_host.adapters, gantry.worker.model_host.child\n"
        "heavy = sorted(m for m in ('numpy', 'torch', 'transformers', 'sentence_transformers',"
        " 'PIL', 'torchvision') if m in sys.modules)\n"
        "print(heavy, threading.active_count())\n"
    )
    completed = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    )
    assert completed.stdout.strip() == "[] 1"


def test_network_guard_is_reported_only_once_installed() -> None:
    script = (
        "from gantry.worker.model_host import hardening, probe_evidence as p\n"
        "before = p.network_guard_installed()\n"
        "hardening.install_network_guard()\n"
        "print(before, p.network_guard_installed())\n"
    )
    completed = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, check=True
    )
    assert completed.stdout.strip() == "False True"
    assert network_guard_installed() is False  # this test process never installed it

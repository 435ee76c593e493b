"""The control plane reads media headers without an imaging or audio library (a fresh process).

A child process imports the control plane and its media inference service and lists which of
Pillow, soundfile, numpy and torch came with them: none may. The header readers themselves are
tested in tests/unit/test_media_headers.py; this one runs a process, which the unit guard refuses.
"""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_control_plane_reads_headers_without_an_imaging_or_audio_library() -> None:
    modules = ("PIL", "soundfile", "numpy", "torch")
    script = (
        "import importlib, json, sys\n"
        "for name in ('gantry.controlplane.app', 'gantry.controlplane.serving.media_inference'):\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))\n"
    )
    output = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(output.stdout) == []

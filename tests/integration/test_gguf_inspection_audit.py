"""Inspecting a GGUF in a fresh interpreter, under an audit hook: it opens only the GGUF file.

Nothing is imported from a runtime, launched or loaded while a GGUF is inspected. The facts the
inspection reads are tested in tests/unit/test_gguf_inspection.py; this one runs a process, which
the unit guard refuses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import tiny_gguf


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    tiny_gguf.write_tiny_gguf(tmp_path / "tiny-llama.Q8_0.gguf")
    return tmp_path


def test_inspecting_imports_no_runtime_opens_only_the_gguf_and_runs_nothing(
    tiny_dir: Path,
) -> None:
    """In a fresh interpreter, every import, open and process launch during the inspection is
    recorded by an audit hook: only the GGUF is opened, nothing is launched or loaded."""
    script = f"""
import json, sys
from gantry.worker.artifact_copies import reader_of_copy
from gantry.worker.inspection import ArtifactFiles, inspect_artifact
from pathlib import Path
directory = Path({str(tiny_dir)!r})
files = ArtifactFiles({{p.name: p.stat().st_size for p in directory.iterdir()}},
                      reader_of_copy(directory))
events = []
WATCHED = ("import", "open", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn",
           "os.fork", "ctypes.dlopen", "exec", "compile")
def hook(event, args):
    if event in WATCHED:
        events.append([event, str(args[0])])
sys.addaudithook(hook)
inspection = inspect_artifact(files, environment_id="default", environment_adapters=[])
loaded = sorted(m for m in sys.modules
                if m.split(".")[0] in ("torch", "numpy", "gguf", "llama_cpp", "transformers"))
print(json.dumps({{"events": events, "loaded": loaded, "model": inspection.model_type}}))
"""
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    report = json.loads(completed.stdout)
    assert report["model"] == "llama"
    assert report["loaded"] == []
    # os.open reports the path relative to the directory it walks.
    assert {event for event, _ in report["events"]} <= {"open"}, report["events"]
    assert {target for _, target in report["events"]} == {str(tiny_dir), "tiny-llama.Q8_0.gguf"}

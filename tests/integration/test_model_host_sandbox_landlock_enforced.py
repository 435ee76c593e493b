"""Landlock enforced for real: a child in the sandbox reads only what its rules grant.

Where the kernel allows Landlock, a child enters the model host's sandbox and tries to read and
write inside and outside its grants. The rules and levels are tested in
tests/unit/test_model_host_sandbox_landlock.py; this one runs a process, which the unit guard
refuses.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gantry.worker.model_host import landlock

_RESTRICT_AND_PROBE = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from gantry.worker.model_host import landlock, sandbox
    allowed, denied, private = (Path(p) for p in sys.argv[1:4])
    isolation = sandbox.enter(model_directory=allowed, private_dir=private, device="cpu")
    def attempt(action):
        try:
            action()
            return "allowed"
        except OSError as exc:
            return f"denied {exc.errno}"
    print(json.dumps({
        "level": isolation.level.name,
        "reason": isolation.reason,
        "read_allowed": attempt(lambda: (allowed / "config.json").read_text()),
        "write_allowed_dir": attempt(lambda: (allowed / "new").write_text("x")),
        "read_denied": attempt(lambda: denied.read_text()),
        "write_private": attempt(lambda: (private / "scratch").write_text("x")),
    }))
    """
)


def test_a_restricted_process_reads_only_what_its_rules_grant(tmp_path: Path) -> None:
    try:
        landlock.abi_version()
    except landlock.LandlockUnavailable as exc:
        pytest.skip(f"this kernel refuses Landlock: {exc}")
    allowed, private = tmp_path / "artifact", tmp_path / "private"
    allowed.mkdir()
    private.mkdir()
    (allowed / "config.json").write_text("{}")
    denied = tmp_path / "secret"
    denied.write_text("s3cret")
    completed = subprocess.run(
        [sys.executable, "-I", "-c", _RESTRICT_AND_PROBE, str(allowed), str(denied), str(private)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    outcome = json.loads(completed.stdout)
    assert outcome["level"] != "NONE", outcome["reason"]
    assert outcome["read_allowed"] == "allowed"
    assert outcome["write_allowed_dir"] == "denied 13"
    assert outcome["read_denied"] == "denied 13"
    assert outcome["write_private"] == "allowed"

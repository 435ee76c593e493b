"""Importing the CLI in a fresh interpreter does not import torch.

The CLI's role dispatch is tested in tests/unit/test_cli_imports.py; this runs a process, which the
unit guard refuses.
"""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_cli_does_not_import_torch() -> None:
    probe = (
        "import sys, gantry.cli.main, gantry.cli.up, gantry.cli.supervisor;"
        "heavy = sorted(m for m in ('torch', 'transformers', 'sentence_transformers', 'numpy')"
        " if m in sys.modules);"
        "print(','.join(heavy))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == ""

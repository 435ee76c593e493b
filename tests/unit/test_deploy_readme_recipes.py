"""The deploy README's token recipes make tokens the services accept, run as pasted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from gantry.common import tokens

README = Path(__file__).resolve().parents[2] / "deploy" / "README.md"


def _recipe(target: str) -> str:
    text = README.read_text().replace("\\\n", "")
    match = re.search(rf'python3 -c "([^"]+)"\s*>\s*secrets/{re.escape(target)}', text)
    assert match, f"no recipe for secrets/{target} in {README}"
    return match.group(1)


def _run(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout


def test_the_operator_token_recipe_makes_an_operator_token():
    token = _run(_recipe("operator.token"))
    assert tokens.parse_token(token, kind=tokens.OPERATOR_TOKEN) is not None


def test_the_scheduler_token_recipe_makes_a_service_token():
    token = _run(_recipe("scheduler.token"))
    assert tokens.parse_token(token, kind=tokens.SERVICE_TOKEN) is not None

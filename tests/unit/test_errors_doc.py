"""docs/errors.md documents every reason of gantry.common.errors.REASONS, with its gRPC code.

A reason added to the table without a row in the doc (or a code changed in one place only) fails
here, and so does a row for a reason the code does not have.
"""

from __future__ import annotations

import re
from pathlib import Path

from gantry.common.errors import REASONS

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
ROW = re.compile(r"^\| `([A-Z_]+)` \| `([A-Z_]+)` \| (.+?) \| (.+?) \|$", re.M)


def documented(text: str) -> dict[str, str]:
    return {reason: code for reason, code, _, _ in ROW.findall(text)}


def problems(text: str) -> list[str]:
    rows = documented(text)
    found = [f"{r} is not in docs/errors.md" for r in REASONS if r not in rows]
    found += [
        f"{r}: docs/errors.md says {rows[r]}, errors.py maps it to {spec.code.name}"
        for r, spec in REASONS.items()
        if r in rows and rows[r] != spec.code.name
    ]
    found += [f"{r} is documented but not in errors.REASONS" for r in rows if r not in REASONS]
    return found


def test_every_reason_is_documented_with_its_code() -> None:
    assert problems(DOC.read_text()) == []


def test_each_row_says_what_it_means_and_what_to_do() -> None:
    for reason, _, meaning, action in ROW.findall(DOC.read_text()):
        assert len(meaning) > 20 and len(action) > 3, reason


def test_the_check_fails_on_a_missing_a_wrong_and_an_unknown_row() -> None:
    text = DOC.read_text()
    missing = re.sub(r"^\| `QUEUE_FULL` .*$", "", text, flags=re.M)
    wrong = text.replace("| `NOT_FOUND` | `NOT_FOUND` |", "| `NOT_FOUND` | `INTERNAL` |")
    unknown = text + "\n| `NO_SUCH_REASON` | `INTERNAL` | made up for the test | nothing |\n"
    # Compared with the doc as it is, so a reason added elsewhere meanwhile does not blur it.
    before = set(problems(text))

    def new(changed: str) -> list[str]:
        return [p for p in problems(changed) if p not in before]

    assert new(missing) == ["QUEUE_FULL is not in docs/errors.md"]
    expected = "NOT_FOUND: docs/errors.md says INTERNAL, errors.py maps it to NOT_FOUND"
    assert new(wrong) == [expected]
    assert new(unknown) == ["NO_SUCH_REASON is documented but not in errors.REASONS"]

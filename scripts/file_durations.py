"""Seconds per test file from a pytest JUnit XML report, as tests/file_durations.json wants them.

    .venv/bin/python -m pytest -n 2 --dist loadfile --junitxml=build/junit.xml
    .venv/bin/python scripts/file_durations.py build/junit.xml > tests/file_durations.json

Only files of at least a few seconds are kept: below that the order hardly matters, and the
guess by directory and test count (tests/conftest.py) places them.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict

_KEEP_FROM_S = 3.0


def file_seconds(report: str) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        # classname is the dotted module path plus any class: tests.unit.test_x.TestY
        module = [part for part in case.get("classname", "").split(".") if part]
        while module and not module[-1].startswith("test_"):
            module.pop()
        if module:
            seconds["/".join(module) + ".py"] += float(case.get("time", "0"))
    return {path: round(s, 1) for path, s in sorted(seconds.items()) if s >= _KEEP_FROM_S}


if __name__ == "__main__":
    json.dump(file_seconds(sys.argv[1]), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")

"""An operator's node labels: the one rule for the labels a node is registered with
(`RegisterNodeRequest.labels`, `gantry nodes register NAME --label key=value`) and for the
`key=value` labels a deployment's placement constraints require of a node. Pure.

A key is a letter or digit, then up to 62 letters, digits, `.`, `_`, `/` or `-`; a value is up to
256 printable characters. Placement sees a registered label as the string `key=value`: a key holds
no `:`, so none reads as a label the control plane derives (`adapter:<name>`, `device:cuda`, ...).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MAX_LABELS = 64
MAX_LABEL_VALUE_CHARS = 256
LABEL_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,62})$")
FORMAT = "key=value (a key of 1-63 letters, digits, . _ / -; a value of printable characters)"


def label_value_ok(value: str) -> bool:
    return len(value) <= MAX_LABEL_VALUE_CHARS and not any(ord(c) < 0x20 for c in value)


def is_node_label(text: str) -> bool:
    """Whether `text` is a `key=value` a registered node can carry."""
    key, separator, value = text.partition("=")
    return bool(separator) and LABEL_KEY.fullmatch(key) is not None and label_value_ok(value)


def placement_label(key: str, value: str) -> str:
    """A registered label as placement compares it."""
    return f"{key}={value}"


def label_problem(labels: Sequence[str]) -> str:
    """Why these `key=value` labels cannot be required ("" when they can)."""
    if len(labels) > MAX_LABELS:
        return f"{len(labels)} node labels; at most {MAX_LABELS}"
    for label in labels:
        if not is_node_label(label):
            return f"node label {label[:80]!r} is not {FORMAT}"
    return ""

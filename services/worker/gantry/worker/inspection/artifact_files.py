"""What an inspector may look at: the verified listing, size-capped reads, and its draft answer.

Inspectors are pure: they get the manifest's paths and sizes and a `read(path, limit)` callable,
parse config files only (JSON, GGUF headers) and never import or execute what they read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gantry.common.artifact_gate import MAX_CONFIG_BYTES, ReadFile
from gantry.v1 import worker_gateway_pb2 as wg

INCOMPATIBLE = "RUNTIME_INCOMPATIBLE"
ENVIRONMENT_UNAVAILABLE = "RUNTIME_ENVIRONMENT_UNAVAILABLE"
NOTE = ""  # a finding that explains, without refusing


def finding(reason: str, message: str, path: str = "") -> wg.InspectionFinding:
    return wg.InspectionFinding(reason=reason, message=message, path=path)


@dataclass(frozen=True)
class ArtifactFiles:
    """The files of one verified artifact set: relative '/'-path -> size, and a capped reader."""

    sizes: Mapping[str, int]
    read: ReadFile

    def has(self, path: str) -> bool:
        return path in self.sizes

    def paths(self) -> list[str]:
        return sorted(self.sizes)

    def ending(self, suffix: str) -> list[str]:
        return [path for path in self.paths() if path.lower().endswith(suffix)]

    def json(self, path: str) -> tuple[Any, wg.InspectionFinding | None]:
        """The parsed JSON document at `path` (None when absent), or None and why it is unusable."""
        if path not in self.sizes:
            return None, None
        if self.sizes[path] > MAX_CONFIG_BYTES:
            return None, finding(
                INCOMPATIBLE, f"{path} is larger than {MAX_CONFIG_BYTES} bytes; not inspected", path
            )
        raw = self.read(path, MAX_CONFIG_BYTES + 1)
        try:
            return json.loads(raw.decode("utf-8")), None
        except (UnicodeDecodeError, ValueError) as exc:
            return None, finding(INCOMPATIBLE, f"{path} is not valid UTF-8 JSON: {exc}", path)

    def json_object(self, path: str, findings: list[wg.InspectionFinding]) -> dict[str, Any]:
        """The JSON object at `path`, or {} (a problem with it goes to `findings`)."""
        document, problem = self.json(path)
        if problem is not None:
            findings.append(problem)
        if document is None:
            return {}
        if not isinstance(document, dict):
            findings.append(finding(INCOMPATIBLE, f"{path} is not a JSON object", path))
            return {}
        return document


@dataclass(kw_only=True)
class Draft:
    """One inspector's reading of a layout; the dispatcher adds weights, the gate and adapters
    (the runtime adapters' `inspect_support` decides which run it)."""

    inspector: str
    key_path: str  # the file that identified the layout
    model_type: str = ""
    modalities: list[str] = field(default_factory=list)
    task: str = ""
    findings: list[wg.InspectionFinding] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict)

    def refuse(self, message: str, path: str = "") -> None:
        """An INCOMPATIBLE finding: what the model host could not run, read from `path` (the file
        that identified the layout when none is named)."""
        self.findings.append(finding(INCOMPATIBLE, message, path or self.key_path))

    def keep_sub_config(
        self, config: Mapping[str, Any], name: str, prefix: str, keys: tuple[str, ...]
    ) -> dict[str, Any]:
        """The nested config `name` of `config` ({} when it is not one), its `keys` kept into
        the details as `prefix + key` ("encoder_image_size")."""
        nested = sub_config(config, name)
        keep_prefixed(self.details, nested, prefix, keys)
        return nested


def text(value: object) -> str:
    """A config value as a details string: JSON scalars as JSON writes them, lists comma-joined."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(text(item) for item in value)
    if value is None:
        return ""
    return str(value)


def keep(details: dict[str, str], config: Mapping[str, Any], *keys: str) -> None:
    """Copy the named scalar keys of `config` that are present into `details`."""
    for key in keys:
        value = config.get(key)
        if isinstance(value, (str, int, float, bool)) or (
            isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value)
        ):
            details[key] = text(value)


def keep_prefixed(
    details: dict[str, str], config: Mapping[str, Any], prefix: str, keys: tuple[str, ...]
) -> None:
    """`keep`, each key stored as `prefix + key` (a sub-config's keys: "encoder_image_size")."""
    found: dict[str, str] = {}
    keep(found, config, *keys)
    details.update({f"{prefix}{key}": value for key, value in found.items()})


def sub_config(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A nested config object ("encoder", "vision_config"), or {} when it is not one."""
    value = config.get(name)
    return value if isinstance(value, dict) else {}


def positive_int(value: object) -> int | None:
    """A JSON integer above 0 (sizes, widths, counts); None for anything else (bools too)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

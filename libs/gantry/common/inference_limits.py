"""The bounds on one Inference call: the defaults the CLI splits its calls (and refuses bench flags)
by, and the settings the control plane enforces, from its flags, else the environment.

A server may run with lower (or higher) limits than the defaults; every refusal names the limit in
its error metadata, so a client learns the server's own value from the first refusal.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

MAX_INPUTS = 1024  # texts (Embed) or documents (Rerank) per call
MAX_INPUT_CHARS = 100_000  # characters per text
# The whole request's text, so the Invoke built from it stays far inside the worker stream's
# message limit: an oversize call gets a typed error, never a torn-down worker stream.
MAX_REQUEST_TEXT_BYTES = 8 * 1024 * 1024

# How far an operator may raise each limit. The gRPC message and model-host frame limits are
# 64 MiB (grpc_server.MESSAGE_LIMIT_BYTES, framing.MAX_FRAME_BYTES): half of that for the request's
# text leaves room for the envelope, and 4,096 vectors of 1,024 float32 answer in 16 MiB.
MAX_INPUTS_CEILING = 4096
MAX_REQUEST_BYTES_CEILING = 32 * 1024 * 1024


class LimitSettingsError(ValueError):
    """A limit setting out of range or not a whole number: an operator's mistake, one line."""


@dataclass(frozen=True, slots=True)
class LimitSetting:
    """One limit: its InferenceLimits field, its flag, its environment variable, its range."""

    field: str
    flag: str
    env: str
    ceiling: int
    help: str


LIMIT_SETTINGS: tuple[LimitSetting, ...] = (
    LimitSetting(
        "max_inputs",
        "--max-inputs",
        "GANTRY_MAX_INPUTS",
        MAX_INPUTS_CEILING,
        "texts (Embed) or documents (Rerank) per call",
    ),
    LimitSetting(
        "max_input_chars",
        "--max-input-chars",
        "GANTRY_MAX_INPUT_CHARS",
        MAX_REQUEST_BYTES_CEILING,
        "characters per text (each input, the query, each document)",
    ),
    LimitSetting(
        "max_request_bytes",
        "--max-request-bytes",
        "GANTRY_MAX_REQUEST_BYTES",
        MAX_REQUEST_BYTES_CEILING,
        "UTF-8 bytes of text in one call, all texts together",
    ),
)


@dataclass(frozen=True, kw_only=True)
class InferenceLimits:
    """The limits the control plane enforces on each Embed and Rerank call."""

    max_inputs: int = MAX_INPUTS
    max_input_chars: int = MAX_INPUT_CHARS
    max_request_bytes: int = MAX_REQUEST_TEXT_BYTES

    def __post_init__(self) -> None:
        for setting in LIMIT_SETTINGS:
            value = getattr(self, setting.field)
            if not 1 <= value <= setting.ceiling:
                raise LimitSettingsError(
                    f"{setting.flag} must be between 1 and {setting.ceiling}, not {value}"
                )


DEFAULT_LIMITS = InferenceLimits()
assert {setting.field for setting in LIMIT_SETTINGS} == {f.name for f in fields(InferenceLimits)}


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("limits on one Embed/Rerank call (flag, else environment)")
    for setting in LIMIT_SETTINGS:
        group.add_argument(
            setting.flag,
            metavar="N",
            help=f"{setting.help}; default {getattr(DEFAULT_LIMITS, setting.field)}, "
            f"at most {setting.ceiling} (env {setting.env})",
        )


def limits_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> InferenceLimits:
    """The limits from `add_limit_arguments` flags, else the environment, else the defaults.

    Raises LimitSettingsError naming the flag or variable that is wrong."""
    env = os.environ if env is None else env
    chosen: dict[str, int] = {}
    for setting in LIMIT_SETTINGS:
        flag_value = getattr(args, setting.field, None)
        raw, source = (
            (flag_value, setting.flag) if flag_value is not None else (env.get(setting.env), None)
        )
        if raw is None or raw == "":
            continue
        source = source or setting.env
        try:
            chosen[setting.field] = int(str(raw).strip())
        except ValueError:
            raise LimitSettingsError(f"{source} must be a whole number, not {raw!r}") from None
        if not 1 <= chosen[setting.field] <= setting.ceiling:
            raise LimitSettingsError(
                f"{source} must be between 1 and {setting.ceiling}, not {chosen[setting.field]}"
            )
    return InferenceLimits(**chosen)

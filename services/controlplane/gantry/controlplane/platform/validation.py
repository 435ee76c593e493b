"""Input checks shared by the operator RPCs: names, lengths, labels, adapter settings.

Every refusal is a typed INVALID_ARGUMENT naming the field (and its limit), raised before any
database work; an adapter no worker can run is RUNTIME_INCOMPATIBLE, never a fallback.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from gantry.common import node_labels
from gantry.common.errors import GantryError, excerpt, invalid_argument
from gantry.common.inference_limits import MAX_TOKENS_CEILING
from gantry.controlplane.deployments.autoscale_rules import PlacementPolicyName
from gantry.controlplane.evidence.adapter_modalities import (
    ADAPTER_MODALITIES,
    GENERATION_ADAPTERS,
    IMAGE_ADAPTERS,
    WHISPER_ADAPTER,
)
from gantry.v1 import common_pb2

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# The adapters a worker can execute in this version (one module per adapter on the worker side).
SUPPORTED_ADAPTERS = frozenset(ADAPTER_MODALITIES)
# Adapter settings only speech recognition reads: the decoder's language and task, the rate.
WHISPER_TASKS = ("transcribe", "translate")
# Whisper's language tokens are ISO 639-1 codes, plus a few three-letter ones ("haw", "yue").
_LANGUAGE_CODE = re.compile(r"[a-z]{2,3}")
MAX_SAMPLING_RATE_HZ = 384_000  # the highest rate audio interfaces record at
# Adapter settings only the image adapters read: the processor's size and normalisation.
_IMAGE_ADAPTER_NAMES = ", ".join(sorted(IMAGE_ADAPTERS))
_GENERATION_ADAPTER_NAMES = ", ".join(sorted(GENERATION_ADAPTERS))
MAX_IMAGE_SIZE = 8192  # pixels per side; image encoders take a few hundred
_CHANNEL_COUNTS = (1, 3)  # one value for every channel, or one per RGB channel

# A node's labels: the one rule, shared with what a deployment's placement constraints require.
MAX_LABELS = node_labels.MAX_LABELS
_LABEL_KEY = node_labels.LABEL_KEY
MAX_LABEL_VALUE_CHARS = node_labels.MAX_LABEL_VALUE_CHARS
MAX_API_KEY_NAME_CHARS = 200
MAX_ENVIRONMENT_ID_CHARS = 200
MAX_BATCH_SIZE = 4096
MAX_INPUT_LENGTH_TOKENS = 1_000_000
MAX_REASON_CHARS = 1000
# Byte sizes are stored in signed 64-bit columns.
MAX_BYTES = 2**63 - 1
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
MAX_REPLICAS = 64
_PLACEMENT_POLICIES = {
    common_pb2.PLACEMENT_POLICY_UNSPECIFIED: PlacementPolicyName.BIN_PACK,
    common_pb2.PLACEMENT_POLICY_BIN_PACK: PlacementPolicyName.BIN_PACK,
    common_pb2.PLACEMENT_POLICY_SPREAD: PlacementPolicyName.SPREAD,
}


def _check_labels(labels: dict[str, str]) -> dict[str, str]:
    if len(labels) > MAX_LABELS:
        raise invalid_argument(
            f"at most {MAX_LABELS} labels", field="labels", limit=str(MAX_LABELS)
        )
    for key, value in labels.items():
        if not _LABEL_KEY.fullmatch(key):
            raise invalid_argument(
                f"label key {key[:80]!r} must be 1-63 letters, digits, '.', '_', '/' or '-'",
                field="labels",
            )
        if len(value) > MAX_LABEL_VALUE_CHARS or any(ord(c) < 0x20 for c in value):
            raise invalid_argument(
                f"label {key!r} must be at most {MAX_LABEL_VALUE_CHARS} printable characters",
                field="labels",
                limit=str(MAX_LABEL_VALUE_CHARS),
            )
    return labels


def _check_length(value: str, *, field: str, limit: int) -> str:
    if len(value) > limit:
        raise invalid_argument(
            f"{field} must be at most {limit} characters", field=field, limit=str(limit)
        )
    return value


def _check_name(value: str, *, field: str) -> str:
    if not _NAME.fullmatch(value):
        raise invalid_argument(
            f"{field} must be 1-128 letters, digits, '.', '_' or '-', got {excerpt(repr(value))}",
            field=field,
        )
    return value


def check_bytes(value: int, *, field: str) -> int:
    if value > MAX_BYTES:
        raise invalid_argument(
            f"{field} must be at most {MAX_BYTES}", field=field, limit=str(MAX_BYTES)
        )
    return value


def check_supported_adapter(name: str) -> str:
    if name not in SUPPORTED_ADAPTERS:
        raise GantryError(
            "RUNTIME_INCOMPATIBLE",
            f"adapter {name!r} is not supported; supported: "
            + ", ".join(sorted(SUPPORTED_ADAPTERS)),
            adapter=name,
        )
    return name


def check_adapter_settings(adapter: common_pb2.AdapterSettings) -> common_pb2.AdapterSettings:
    """The settings' own limits (device, batch size, input length, Whisper's language, task and
    sampling rate, the image adapters' preprocessing, a causal LM's max new tokens); the name is
    checked apart."""
    if adapter.device and not _DEVICE.fullmatch(adapter.device):
        raise invalid_argument(
            f"device {adapter.device!r} is not cpu or cuda[:N]", field="adapter.device"
        )
    if adapter.max_batch_size > MAX_BATCH_SIZE:
        raise invalid_argument(
            f"adapter.max_batch_size must be at most {MAX_BATCH_SIZE}",
            field="adapter.max_batch_size",
            limit=str(MAX_BATCH_SIZE),
        )
    if adapter.max_input_length > MAX_INPUT_LENGTH_TOKENS:
        raise invalid_argument(
            f"adapter.max_input_length must be at most {MAX_INPUT_LENGTH_TOKENS}",
            field="adapter.max_input_length",
            limit=str(MAX_INPUT_LENGTH_TOKENS),
        )
    _check_speech_settings(adapter)
    _check_image_settings(adapter)
    _check_generation_settings(adapter)
    return adapter


def _read_only_by(adapter: common_pb2.AdapterSettings, name: str, readers: str) -> GantryError:
    return invalid_argument(
        f"adapter.{name} is read only by {readers}, not {adapter.adapter or 'the default adapter'}",
        field=f"adapter.{name}",
    )


def _check_speech_settings(adapter: common_pb2.AdapterSettings) -> None:
    """language, task and sampling_rate_hz: a short code (or empty: detected per clip),
    transcribe/translate (or empty: transcribe) and a rate (or 0: the one inspection read), for
    Whisper only; another adapter would silently ignore them."""
    if adapter.adapter != WHISPER_ADAPTER:
        for name in ("language", "task", "sampling_rate_hz"):
            if getattr(adapter, name):
                raise _read_only_by(adapter, name, WHISPER_ADAPTER)
        return
    if adapter.sampling_rate_hz > MAX_SAMPLING_RATE_HZ:
        raise invalid_argument(
            f"adapter.sampling_rate_hz must be at most {MAX_SAMPLING_RATE_HZ}",
            field="adapter.sampling_rate_hz",
            limit=str(MAX_SAMPLING_RATE_HZ),
        )
    if adapter.language and not _LANGUAGE_CODE.fullmatch(adapter.language):
        raise invalid_argument(
            f"adapter.language must be empty (detected per clip) or a 2-3 letter lowercase "
            f"language code such as 'en', got {adapter.language[:40]!r}",
            field="adapter.language",
        )
    if adapter.task and adapter.task not in WHISPER_TASKS:
        raise invalid_argument(
            f"adapter.task must be empty (transcribe) or one of {', '.join(WHISPER_TASKS)}, "
            f"got {adapter.task[:40]!r}",
            field="adapter.task",
        )


def _check_generation_settings(adapter: common_pb2.AdapterSettings) -> None:
    """max_new_tokens (0: the adapter's default), for the generation adapters only (in process
    or a managed server); another adapter would silently ignore it. Its ceiling is the control
    plane's own for max_tokens: a deployment cannot be asked for more than any call may ask."""
    if adapter.adapter not in GENERATION_ADAPTERS:
        if adapter.max_new_tokens:
            raise _read_only_by(adapter, "max_new_tokens", _GENERATION_ADAPTER_NAMES)
        return
    if adapter.max_new_tokens > MAX_TOKENS_CEILING:
        raise invalid_argument(
            f"adapter.max_new_tokens must be at most {MAX_TOKENS_CEILING}",
            field="adapter.max_new_tokens",
            limit=str(MAX_TOKENS_CEILING),
        )


def _check_image_settings(adapter: common_pb2.AdapterSettings) -> None:
    """image_size, image_mean and image_std (0 / empty: what inspection read), for the image
    adapters only; another adapter would silently ignore them. A mean or std is one value for
    every channel or one per RGB channel, finite; a std is positive (it divides)."""
    if adapter.adapter not in IMAGE_ADAPTERS:
        for name in ("image_size", "image_mean", "image_std"):
            if getattr(adapter, name):
                raise _read_only_by(adapter, name, _IMAGE_ADAPTER_NAMES)
        return
    if adapter.image_size > MAX_IMAGE_SIZE:
        raise invalid_argument(
            f"adapter.image_size must be at most {MAX_IMAGE_SIZE} pixels",
            field="adapter.image_size",
            limit=str(MAX_IMAGE_SIZE),
        )
    _check_normalisation("image_mean", adapter.image_mean)
    _check_normalisation("image_std", adapter.image_std)


def _check_normalisation(name: str, values: Sequence[float]) -> None:
    if not values:
        return
    field = f"adapter.{name}"
    if len(values) not in _CHANNEL_COUNTS:
        raise invalid_argument(
            f"{field} must hold 1 value (every channel) or 3 (R, G, B), got {len(values)}",
            field=field,
            limit="3",
        )
    if not all(math.isfinite(value) for value in values):
        raise invalid_argument(f"{field} must hold finite numbers", field=field)
    if name == "image_std" and not all(value > 0 for value in values):
        raise invalid_argument(f"{field} must be positive (it divides)", field=field)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaRequest:
    """A deployment's replicas and autoscale bounds, each resolved (no 0 left) and checked."""

    replicas: int
    min_replicas: int
    max_replicas: int


def check_replicas(*, replicas: int, min_replicas: int, max_replicas: int) -> ReplicaRequest:
    """replicas 0 = 1; a bound 0 = replicas; then min <= replicas <= max <= MAX_REPLICAS."""
    replicas = replicas or 1
    resolved = ReplicaRequest(
        replicas=replicas,
        min_replicas=min_replicas or replicas,
        max_replicas=max_replicas or replicas,
    )
    for field, value in (("replicas", resolved.replicas), ("max_replicas", resolved.max_replicas)):
        if value > MAX_REPLICAS:
            raise invalid_argument(
                f"{field} must be at most {MAX_REPLICAS}", field=field, limit=str(MAX_REPLICAS)
            )
    if resolved.min_replicas > resolved.replicas:
        raise invalid_argument(
            f"min_replicas ({resolved.min_replicas}) must be at most replicas "
            f"({resolved.replicas})",
            field="min_replicas",
            limit=str(resolved.replicas),
        )
    if resolved.replicas > resolved.max_replicas:
        raise invalid_argument(
            f"max_replicas ({resolved.max_replicas}) must be at least replicas "
            f"({resolved.replicas})",
            field="max_replicas",
        )
    return resolved


def check_placement_policy(policy: int) -> PlacementPolicyName:
    """UNSPECIFIED is BIN_PACK; a value this version does not know is refused, not guessed."""
    try:
        return _PLACEMENT_POLICIES[common_pb2.PlacementPolicy.ValueType(policy)]
    except KeyError:
        raise invalid_argument(
            f"placement_policy {policy} is not BIN_PACK or SPREAD", field="placement_policy"
        ) from None

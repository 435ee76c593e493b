"""The preprocessing a runtime profile binds, from what its assessment's inspection read. Pure.

A profile records the preprocessing its model will run with, so that it is evidence and not an
assumption: for the image adapters the processor's image size, mean and std; for Whisper the
feature extractor's sampling rate; for the generation adapters the context length (the model's
own, `max_input_length`, which the operator may lower but not raise). Whatever the operator left
unset (0, empty) is filled from the
inspection's details. A value the operator set must agree with what the artifact's own processor
does (the model host refuses a load whose processor disagrees, RUNTIME_INCOMPATIBLE), so a
disagreement is refused here, INVALID_ARGUMENT naming the field, before anything is created; so
is a value for something the inspection read nothing of (a SigLIP2 processor has no fixed size).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence

from gantry.common.errors import GantryError, invalid_argument
from gantry.controlplane.evidence.adapter_modalities import (
    GENERATION_ADAPTERS,
    IMAGE_ADAPTERS,
    WHISPER_ADAPTER,
)
from gantry.v1 import common_pb2

# Inspection details (`gantry.worker.inspection`) -> the AdapterSettings field each fills.
IMAGE_SIZE_DETAIL = "image_size"
IMAGE_MEAN_DETAIL = "image_mean"
IMAGE_STD_DETAIL = "image_std"
SAMPLING_RATE_DETAIL = "sampling_rate"
CONTEXT_LENGTH_DETAIL = "context_length"  # a transformers config's or a GGUF header's
_FLOAT32_MAX = 3.4028234663852886e38


def bind_preprocessing(
    settings: common_pb2.AdapterSettings, details: Mapping[str, str]
) -> common_pb2.AdapterSettings:
    """`settings` with the preprocessing inspection read filled in where it was unset (a copy;
    `settings` is left as it was). Raises INVALID_ARGUMENT for an operator's value that
    disagrees with the artifact, RUNTIME_INCOMPATIBLE for details that are not numbers."""
    bound = common_pb2.AdapterSettings()
    bound.CopyFrom(settings)
    if bound.adapter in IMAGE_ADAPTERS:
        size = _whole(details, IMAGE_SIZE_DETAIL)
        bound.image_size = _bound_whole(bound.image_size, size, "image_size")
        for field, detail in (("image_mean", IMAGE_MEAN_DETAIL), ("image_std", IMAGE_STD_DETAIL)):
            values = _bound_values(list(getattr(bound, field)), _floats(details, detail), field)
            del getattr(bound, field)[:]
            getattr(bound, field).extend(values)
    elif bound.adapter == WHISPER_ADAPTER:
        rate = _whole(details, SAMPLING_RATE_DETAIL)
        bound.sampling_rate_hz = _bound_whole(bound.sampling_rate_hz, rate, "sampling_rate_hz")
    elif bound.adapter in GENERATION_ADAPTERS:
        context = _whole(details, CONTEXT_LENGTH_DETAIL)
        bound.max_input_length = _bound_context(bound.max_input_length, context)
    return bound


def _bound_context(given: int, read: int | None) -> int:
    """A generation profile's context: the model's own when unset; lower is a choice (less
    memory for the KV cache), higher is a context the model was never trained for."""
    if not given:
        return read or 0
    if read is not None and given > read:
        raise invalid_argument(
            f"adapter.max_input_length is {given}, but the model's context is {read} tokens (as "
            f"its assessment read it); leave it unset to bind {read}, or set it lower",
            field="adapter.max_input_length",
            limit=str(read),
        )
    return given


def _bound_whole(given: int, read: int | None, field: str) -> int:
    if not given:
        return read or 0
    if read is None:
        raise _nothing_read(field, str(given))
    if given != read:
        raise invalid_argument(
            f"adapter.{field} is {given}, but the artifact's processor takes {read} (as its "
            f"assessment read it); leave it unset to bind {read}",
            field=f"adapter.{field}",
        )
    return given


def _bound_values(given: list[float], read: list[float] | None, field: str) -> list[float]:
    if not given:
        return read or []
    if read is None:
        raise _nothing_read(field, _shown(given))
    # The profile holds 32-bit floats: compare what each side is once stored.
    if len(given) != len(read) or any(
        not math.isclose(_float32(a), _float32(b), rel_tol=1e-6, abs_tol=1e-9)
        for a, b in zip(given, read, strict=True)
    ):
        raise invalid_argument(
            f"adapter.{field} is {_shown(given)}, but the artifact's processor normalises with "
            f"{_shown(read)} (as its assessment read it); leave it unset to bind that",
            field=f"adapter.{field}",
        )
    return given


def _nothing_read(field: str, given: str) -> GantryError:
    return invalid_argument(
        f"adapter.{field} is {given}, but the assessment read no {field} from the artifact's "
        "processor (it has none, or leaves it to its class default): a profile binds only what "
        f"the artifact states; leave adapter.{field} unset",
        field=f"adapter.{field}",
    )


def _whole(details: Mapping[str, str], key: str) -> int | None:
    value = details.get(key, "")
    if not value:
        return None
    if not value.isdigit() or int(value) <= 0:
        raise _not_numbers(key, value)
    return int(value)


def _floats(details: Mapping[str, str], key: str) -> list[float] | None:
    value = details.get(key, "")
    if not value:
        return None
    try:
        numbers = [float(part) for part in value.split(",")]
    except ValueError:
        raise _not_numbers(key, value) from None
    # A profile holds 32-bit floats: a value past their range could not be stored.
    if not all(math.isfinite(number) and abs(number) < _FLOAT32_MAX for number in numbers):
        raise _not_numbers(key, value)
    return numbers


def _not_numbers(key: str, value: str) -> GantryError:
    return GantryError(
        "RUNTIME_INCOMPATIBLE",
        f"the assessment's inspection recorded {key}={value[:80]!r}, which a profile cannot bind",
        detail=key,
    )


def _float32(value: float) -> float:
    packed: tuple[float] = struct.unpack("<f", struct.pack("<f", value))
    return packed[0]


def _shown(values: Sequence[float]) -> str:
    return ",".join(f"{_float32(value):.6g}" for value in values)

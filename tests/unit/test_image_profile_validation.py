"""A runtime profile's preprocessing. The image adapters' image size, mean and std (a size within
bounds; 1 or 3 finite numbers, a positive std) and Whisper's sampling rate are checked
(INVALID_ARGUMENT naming the field) and refused on adapters that would ignore them. What the
operator leaves unset is bound from the assessment's inspection; a value that disagrees with the
artifact's processor, or that the inspection read nothing of, is refused naming the field."""

from __future__ import annotations

import math

import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.evidence.profile_preprocessing import bind_preprocessing
from gantry.controlplane.platform.validation import (
    MAX_IMAGE_SIZE,
    SUPPORTED_ADAPTERS,
    check_adapter_settings,
    check_supported_adapter,
)
from gantry.v1 import common_pb2

TROCR = "transformers_trocr"
SIGLIP2 = "transformers_siglip2"
WHISPER = "transformers_whisper"
TROCR_DETAILS = {"image_size": "384", "image_mean": "0.5,0.5,0.5", "image_std": "0.5,0.5,0.5"}
# NaFlex: a patch size and budget, no fixed square.
SIGLIP2_DETAILS = {
    "patch_size": "16",
    "max_num_patches": "256",
    "image_mean": "0.485,0.456,0.406",
    "image_std": "0.229,0.224,0.225",
}


def _refusal(**settings: object) -> GantryError:
    with pytest.raises(GantryError) as caught:
        check_adapter_settings(common_pb2.AdapterSettings(**settings))  # type: ignore[arg-type]
    return caught.value


def _bind_refusal(details: dict[str, str], **settings: object) -> GantryError:
    with pytest.raises(GantryError) as caught:
        bind_preprocessing(common_pb2.AdapterSettings(**settings), details)  # type: ignore[arg-type]
    return caught.value


@pytest.mark.parametrize("adapter", [TROCR, SIGLIP2])
def test_the_image_adapters_are_supported(adapter: str) -> None:
    assert adapter in SUPPORTED_ADAPTERS
    assert check_supported_adapter(adapter) == adapter


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"image_size": 384},
        {"image_size": MAX_IMAGE_SIZE},
        {"image_mean": [0.5], "image_std": [0.5]},
        {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]},
        {"image_mean": [0.0, 0.0, 0.0], "image_std": [1.0]},
    ],
)
@pytest.mark.parametrize("adapter", [TROCR, SIGLIP2])
def test_an_image_adapter_accepts_a_bounded_size_and_a_usable_normalisation(
    adapter: str, settings: dict[str, object]
) -> None:
    message = common_pb2.AdapterSettings(adapter=adapter, **settings)  # type: ignore[arg-type]
    assert check_adapter_settings(message) is message


@pytest.mark.parametrize(
    ("settings", "field", "limit"),
    [
        ({"image_size": MAX_IMAGE_SIZE + 1}, "adapter.image_size", str(MAX_IMAGE_SIZE)),
        ({"image_mean": [0.5, 0.5]}, "adapter.image_mean", "3"),
        ({"image_mean": [0.5, 0.5, 0.5, 0.5]}, "adapter.image_mean", "3"),
        ({"image_std": [0.5, 0.5]}, "adapter.image_std", "3"),
        ({"image_mean": [math.nan, 0.5, 0.5]}, "adapter.image_mean", None),
        ({"image_mean": [math.inf]}, "adapter.image_mean", None),
        ({"image_std": [0.5, 0.0, 0.5]}, "adapter.image_std", None),
        ({"image_std": [-0.5]}, "adapter.image_std", None),
        ({"image_std": [math.nan]}, "adapter.image_std", None),
    ],
)
def test_an_unusable_image_setting_is_invalid_and_names_the_field(
    settings: dict[str, object], field: str, limit: str | None
) -> None:
    error = _refusal(adapter=TROCR, **settings)
    assert error.reason == "INVALID_ARGUMENT"
    assert error.metadata.get("field") == field
    assert error.metadata.get("limit") == limit


@pytest.mark.parametrize(
    "adapter", ["", "sentence_transformers", "sentence_transformers_cross_encoder", WHISPER]
)
@pytest.mark.parametrize(
    ("name", "value"), [("image_size", 224), ("image_mean", [0.5]), ("image_std", [0.5])]
)
def test_image_settings_on_an_adapter_that_would_ignore_them_are_refused(
    adapter: str, name: str, value: object
) -> None:
    error = _refusal(adapter=adapter, **{name: value})
    assert error.reason == "INVALID_ARGUMENT"
    assert error.metadata["field"] == f"adapter.{name}"
    assert "transformers_siglip2, transformers_trocr" in error.message


@pytest.mark.parametrize("adapter", ["", "sentence_transformers", TROCR, SIGLIP2])
def test_a_sampling_rate_on_an_adapter_other_than_whisper_is_refused(adapter: str) -> None:
    error = _refusal(adapter=adapter, sampling_rate_hz=16000)
    assert (error.reason, error.metadata["field"]) == (
        "INVALID_ARGUMENT",
        "adapter.sampling_rate_hz",
    )


def test_a_sampling_rate_past_any_audio_interface_is_refused_with_its_limit() -> None:
    error = _refusal(adapter=WHISPER, sampling_rate_hz=1_000_000)
    assert error.metadata == {"field": "adapter.sampling_rate_hz", "limit": "384000"}
    accepted = common_pb2.AdapterSettings(adapter=WHISPER, sampling_rate_hz=16000)
    assert check_adapter_settings(accepted) is accepted


# ---- bound from the assessment's inspection ---------------------------------------------------


def test_unset_image_preprocessing_is_bound_from_what_inspection_read() -> None:
    given = common_pb2.AdapterSettings(adapter=TROCR, device="cpu")
    bound = bind_preprocessing(given, TROCR_DETAILS)
    assert bound.image_size == 384
    assert list(bound.image_mean) == [0.5, 0.5, 0.5]
    assert list(bound.image_std) == [0.5, 0.5, 0.5]
    assert (bound.adapter, bound.device) == (TROCR, "cpu")
    assert given.image_size == 0 and not given.image_mean  # the operator's message is unchanged


def test_siglip2_binds_its_normalisation_and_no_size() -> None:
    bound = bind_preprocessing(common_pb2.AdapterSettings(adapter=SIGLIP2), SIGLIP2_DETAILS)
    assert bound.image_size == 0  # NaFlex: nothing to bind
    assert [round(v, 6) for v in bound.image_mean] == [0.485, 0.456, 0.406]
    assert [round(v, 6) for v in bound.image_std] == [0.229, 0.224, 0.225]


def test_values_the_operator_set_that_agree_with_the_artifact_are_kept() -> None:
    given = common_pb2.AdapterSettings(
        adapter=SIGLIP2, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]
    )
    bound = bind_preprocessing(given, SIGLIP2_DETAILS)
    assert list(bound.image_mean) == list(given.image_mean)


@pytest.mark.parametrize(
    ("settings", "field", "shown"),
    [
        ({"image_size": 224}, "adapter.image_size", "takes 384"),
        ({"image_mean": [0.485, 0.456, 0.406]}, "adapter.image_mean", "0.5,0.5,0.5"),
        ({"image_std": [0.5]}, "adapter.image_std", "0.5,0.5,0.5"),
    ],
)
def test_a_value_that_disagrees_with_the_artifacts_processor_is_refused(
    settings: dict[str, object], field: str, shown: str
) -> None:
    error = _bind_refusal(TROCR_DETAILS, adapter=TROCR, **settings)
    assert (error.reason, error.metadata) == ("INVALID_ARGUMENT", {"field": field})
    assert shown in error.message


def test_a_size_for_a_processor_without_a_fixed_one_is_refused() -> None:
    error = _bind_refusal(SIGLIP2_DETAILS, adapter=SIGLIP2, image_size=224)
    assert (error.reason, error.metadata) == ("INVALID_ARGUMENT", {"field": "adapter.image_size"})
    assert "read no image_size" in error.message


def test_whispers_sampling_rate_is_bound_and_a_different_one_refused() -> None:
    details = {"sampling_rate": "16000", "languages": "en"}
    bound = bind_preprocessing(common_pb2.AdapterSettings(adapter=WHISPER), details)
    assert bound.sampling_rate_hz == 16000
    error = _bind_refusal(details, adapter=WHISPER, sampling_rate_hz=8000)
    assert error.metadata == {"field": "adapter.sampling_rate_hz"}


def test_a_text_adapter_binds_nothing() -> None:
    given = common_pb2.AdapterSettings(adapter="sentence_transformers", normalize=True)
    assert bind_preprocessing(given, {**TROCR_DETAILS, "sampling_rate": "16000"}) == given


@pytest.mark.parametrize(
    "details",
    [
        {"image_size": "large"},
        {"image_size": "-3"},
        {"image_mean": "0.5,half,0.5"},
        {"image_std": "nan"},
        {"image_std": "1e40"},
    ],
)
def test_details_that_are_not_numbers_are_runtime_incompatible(details: dict[str, str]) -> None:
    error = _bind_refusal(details, adapter=TROCR)
    assert error.reason == "RUNTIME_INCOMPATIBLE"
    assert error.metadata["detail"] in details

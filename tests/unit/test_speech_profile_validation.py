"""A runtime profile's Whisper settings: language is empty or a short code, task is empty,
transcribe or translate; anything else is INVALID_ARGUMENT naming the field. Other adapters do
not read them, so setting them there is refused rather than silently ignored."""

from __future__ import annotations

import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.platform.validation import (
    SUPPORTED_ADAPTERS,
    check_adapter_settings,
    check_supported_adapter,
)
from gantry.v1 import common_pb2

WHISPER = "transformers_whisper"


def _refusal(**settings: object) -> GantryError:
    with pytest.raises(GantryError) as caught:
        check_adapter_settings(common_pb2.AdapterSettings(**settings))  # type: ignore[arg-type]
    return caught.value


def test_whisper_is_a_supported_adapter() -> None:
    assert WHISPER in SUPPORTED_ADAPTERS
    assert check_supported_adapter(WHISPER) == WHISPER


@pytest.mark.parametrize(
    ("language", "task"),
    [("", ""), ("en", ""), ("de", "transcribe"), ("", "translate"), ("haw", "transcribe")],
)
def test_whisper_accepts_a_short_language_code_and_a_known_task(language: str, task: str) -> None:
    settings = common_pb2.AdapterSettings(adapter=WHISPER, language=language, task=task)
    assert check_adapter_settings(settings) is settings


@pytest.mark.parametrize("task", ["sing", "Transcribe", "transcribe ", "detect"])
def test_an_unknown_task_is_invalid_and_names_the_field(task: str) -> None:
    error = _refusal(adapter=WHISPER, task=task)
    assert error.reason == "INVALID_ARGUMENT"
    assert error.metadata["field"] == "adapter.task"
    assert "transcribe, translate" in error.message


@pytest.mark.parametrize("language", ["english", "e", "EN", "en-US", "e1", "<|en|>"])
def test_a_language_that_is_not_a_short_code_is_invalid_and_names_the_field(
    language: str,
) -> None:
    error = _refusal(adapter=WHISPER, language=language)
    assert error.reason == "INVALID_ARGUMENT"
    assert error.metadata["field"] == "adapter.language"


@pytest.mark.parametrize(
    "adapter", ["sentence_transformers", "", "sentence_transformers_cross_encoder"]
)
@pytest.mark.parametrize("name", ["language", "task"])
def test_speech_settings_on_another_adapter_are_refused(adapter: str, name: str) -> None:
    error = _refusal(adapter=adapter, **{name: "en" if name == "language" else "transcribe"})
    assert error.reason == "INVALID_ARGUMENT"
    assert error.metadata["field"] == f"adapter.{name}"

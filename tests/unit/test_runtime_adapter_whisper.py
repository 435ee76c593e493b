"""The worker's `transformers_whisper` adapter: which inspections it runs (a Whisper speech
layout whose feature extractor takes 16 kHz), and what an environment's facts say about it."""

from __future__ import annotations

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.runtime_adapters import registered_adapters, runtime_adapter_for
from gantry.worker.runtime_adapters.whisper import TransformersWhisper

WHISPER = "transformers_whisper"
WHISPER_INSPECTION = wg.Inspection(
    inspector="transformers",
    model_type="whisper",
    modalities=["audio", "text"],
    task="speech-recognition",
    details={"sampling_rate": "16000", "max_source_positions": "1500"},
)


def _supported(inspection: wg.Inspection) -> list[str]:
    return [a.name for a in registered_adapters() if a.inspect_support(inspection).supported]


def test_the_name_resolves_to_the_whisper_adapter() -> None:
    adapter = runtime_adapter_for(WHISPER)
    assert isinstance(adapter, TransformersWhisper)
    assert (adapter.task, adapter.modalities) == ("speech_recognition", ("audio",))


def test_only_the_whisper_adapter_runs_a_whisper_inspection() -> None:
    assert _supported(WHISPER_INSPECTION) == [WHISPER]


def test_another_rate_another_model_type_or_inspector_is_not_run_and_says_why() -> None:
    adapter = runtime_adapter_for(WHISPER)
    cases = {
        "details": ({"sampling_rate": "8000"}, "sampling_rate=8000"),
        "model_type": ("speech_to_text", "not speech_to_text (speech-recognition)"),
        "inspector": ("sentence_transformers", "not sentence_transformers"),
    }
    for field, (value, reason) in cases.items():
        inspection = wg.Inspection()
        inspection.CopyFrom(WHISPER_INSPECTION)
        if field == "details":
            inspection.details.clear()
            inspection.details.update(value)  # type: ignore[arg-type]
        else:
            setattr(inspection, field, value)
        support = adapter.inspect_support(inspection)
        assert not support.supported and reason in support.reason, (field, support)


def test_runtime_facts_list_it_with_torch_and_transformers_versions() -> None:
    facts = {
        "versions": {"python": "3.11.9", "torch": "2.13.0", "transformers": "5.24.0"},
        "adapters": [WHISPER],
    }
    found = runtime_adapter_for(WHISPER).collect_runtime_facts(facts)
    assert (found.available, found.modalities, found.reason) == (True, ("audio",), "")
    assert dict(found.versions) == {"torch": "2.13.0", "transformers": "5.24.0"}


def test_runtime_facts_without_it_say_what_is_missing() -> None:
    facts = {"versions": {"python": "3.11.9", "torch": "2.13.0"}, "adapters": []}
    found = runtime_adapter_for(WHISPER).collect_runtime_facts(facts)
    assert not found.available
    assert (
        found.reason
        == "adapter 'transformers_whisper' needs torch, transformers: missing transformers"
    )

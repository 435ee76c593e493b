"""The worker's `transformers_trocr` adapter: which inspections it runs (a vision-encoder-decoder
with a ViT or DeiT encoder and a trocr decoder), and what an environment's facts say about it
(it needs torchvision and Pillow besides torch and transformers)."""

from __future__ import annotations

import pytest

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.runtime_adapters import registered_adapters, runtime_adapter_for
from gantry.worker.runtime_adapters.trocr import TransformersTrOCR

TROCR = "transformers_trocr"
TROCR_INSPECTION = wg.Inspection(
    inspector="transformers",
    model_type="vision-encoder-decoder",
    modalities=["image", "text"],
    task="image-to-text",
    details={
        "encoder_model_type": "vit",
        "decoder_model_type": "trocr",
        "image_size": "384",
        "image_mean": "0.5,0.5,0.5",
        "image_std": "0.5,0.5,0.5",
    },
)
VERSIONS = {
    "python": "3.11.9",
    "torch": "2.14.1",
    "transformers": "5.24.0",
    "torchvision": "0.29.1",
    "Pillow": "13.0.0",
}


def _supported(inspection: wg.Inspection) -> list[str]:
    return [a.name for a in registered_adapters() if a.inspect_support(inspection).supported]


def _changed(**fields: object) -> wg.Inspection:
    inspection = wg.Inspection()
    inspection.CopyFrom(TROCR_INSPECTION)
    for name, value in fields.items():
        if name == "details":
            inspection.details.update(value)  # type: ignore[arg-type]
        else:
            setattr(inspection, name, value)
    return inspection


def test_the_name_resolves_to_the_trocr_adapter() -> None:
    adapter = runtime_adapter_for(TROCR)
    assert isinstance(adapter, TransformersTrOCR)
    assert (adapter.task, adapter.modalities) == ("text_recognition", ("image",))
    assert adapter.packages == ("torch", "transformers", "torchvision", "Pillow")


def test_only_the_trocr_adapter_runs_a_trocr_inspection() -> None:
    assert _supported(TROCR_INSPECTION) == [TROCR]


def test_a_deit_encoder_is_run_too() -> None:
    assert _supported(_changed(details={"encoder_model_type": "deit"})) == [TROCR]


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"inspector": "sentence_transformers"}, "not sentence_transformers"),
        ({"model_type": "blip"}, "not blip (image-to-text)"),
        ({"task": "feature-extraction"}, "(feature-extraction)"),
        ({"details": {"decoder_model_type": "gpt2"}}, "runs a trocr decoder, not gpt2"),
        ({"details": {"encoder_model_type": "swin"}}, "runs a vit or deit encoder, not swin"),
    ],
)
def test_another_layout_is_not_run_and_says_why(fields: dict[str, object], reason: str) -> None:
    support = runtime_adapter_for(TROCR).inspect_support(_changed(**fields))
    assert not support.supported and reason in support.reason, support


def test_runtime_facts_list_it_with_the_versions_of_its_four_packages() -> None:
    found = runtime_adapter_for(TROCR).collect_runtime_facts(
        {"versions": VERSIONS, "adapters": [TROCR]}
    )
    assert (found.available, found.modalities, found.reason) == (True, ("image",), "")
    assert dict(found.versions) == {
        "torch": "2.14.1",
        "transformers": "5.24.0",
        "torchvision": "0.29.1",
        "Pillow": "13.0.0",
    }


def test_runtime_facts_without_torchvision_say_so() -> None:
    versions = {k: v for k, v in VERSIONS.items() if k != "torchvision"}
    found = runtime_adapter_for(TROCR).collect_runtime_facts({"versions": versions, "adapters": []})
    assert not found.available
    assert found.reason == (
        "adapter 'transformers_trocr' needs torch, transformers, torchvision, Pillow: "
        "missing torchvision"
    )

"""The worker's `transformers_siglip2` adapter: which inspections it runs (a SigLIP2 dual
encoder read as zero-shot image classification), and what an environment's facts say about it
(it needs torchvision and Pillow besides torch and transformers)."""

from __future__ import annotations

import pytest

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.runtime_adapters import registered_adapters, runtime_adapter_for
from gantry.worker.runtime_adapters.siglip2 import TransformersSiglip2

SIGLIP2 = "transformers_siglip2"
SIGLIP2_INSPECTION = wg.Inspection(
    inspector="transformers",
    model_type="siglip2",
    modalities=["image", "text"],
    task="zero-shot-image-classification",
    details={"patch_size": "16", "max_num_patches": "256", "embedding_dimension": "768"},
)


def _supported(inspection: wg.Inspection) -> list[str]:
    return [a.name for a in registered_adapters() if a.inspect_support(inspection).supported]


def test_the_name_resolves_to_the_siglip2_adapter() -> None:
    adapter = runtime_adapter_for(SIGLIP2)
    assert isinstance(adapter, TransformersSiglip2)
    assert (adapter.task, adapter.modalities) == ("image_embedding", ("image",))
    assert adapter.packages == ("torch", "transformers", "torchvision", "Pillow")


def test_only_the_siglip2_adapter_runs_a_siglip2_inspection() -> None:
    assert _supported(SIGLIP2_INSPECTION) == [SIGLIP2]


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("inspector", "diffusers", "not diffusers"),
        ("model_type", "siglip", "not siglip (zero-shot-image-classification)"),
        ("model_type", "clip", "not clip"),
        ("task", "image-classification", "siglip2 (image-classification)"),
    ],
)
def test_another_layout_is_not_run_and_says_why(field: str, value: str, reason: str) -> None:
    inspection = wg.Inspection()
    inspection.CopyFrom(SIGLIP2_INSPECTION)
    setattr(inspection, field, value)
    support = runtime_adapter_for(SIGLIP2).inspect_support(inspection)
    assert not support.supported and reason in support.reason, support


def test_runtime_facts_list_it_when_the_facts_script_found_it() -> None:
    facts = {
        "versions": {"torch": "2.14.1", "transformers": "5.24.0", "torchvision": "0.29.1"},
        "adapters": [SIGLIP2],
    }
    found = runtime_adapter_for(SIGLIP2).collect_runtime_facts(facts)
    assert (found.available, found.modalities) == (True, ("image",))


def test_runtime_facts_without_torchvision_or_pillow_say_what_is_missing() -> None:
    facts = {"versions": {"torch": "2.13.0", "transformers": "5.24.0"}, "adapters": []}
    found = runtime_adapter_for(SIGLIP2).collect_runtime_facts(facts)
    assert not found.available
    assert found.reason == (
        "adapter 'transformers_siglip2' needs torch, transformers, torchvision, Pillow: "
        "missing torchvision, Pillow"
    )

"""The worker's runtime adapter registry, what each adapter decides, and its lifecycle over a
fake host (the real children are walked by test_worker_probe)."""

from __future__ import annotations

import pytest

from gantry.common.errors import FailureClass, GantryError
from gantry.v1 import model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.nvml_readings import Nvml
from gantry.worker.runtime_adapters import (
    DEFAULT_ADAPTER,
    registered_adapters,
    runtime_adapter_for,
)
from gantry.worker.runtime_adapters.base import RuntimeAdapter
from gantry.worker.runtime_adapters.cross_encoder import SentenceTransformersCrossEncoder
from gantry.worker.runtime_adapters.model_host_runtime import HostRunning
from gantry.worker.runtime_adapters.sentence_transformers import SentenceTransformersEmbedding

EMBEDDING = "sentence_transformers"
CROSS_ENCODER = "sentence_transformers_cross_encoder"

EMBEDDING_INSPECTION = wg.Inspection(
    inspector="sentence_transformers",
    model_type="bert",
    modalities=["text"],
    task="embedding",
    details={"normalize": "true"},
)
CROSS_ENCODER_INSPECTION = wg.Inspection(
    inspector="sentence_transformers",
    model_type="bert",
    modalities=["text"],
    task="reranking",
    details={"num_labels": "1"},
)
GGUF_INSPECTION = wg.Inspection(
    inspector="gguf", model_type="llama", modalities=["text"], task="generation"
)


def _supported(inspection: wg.Inspection) -> list[str]:
    return [
        adapter.name
        for adapter in registered_adapters()
        if adapter.inspect_support(inspection).supported
    ]


def test_both_names_resolve_to_their_own_adapter() -> None:
    embedding, cross_encoder = runtime_adapter_for(EMBEDDING), runtime_adapter_for(CROSS_ENCODER)
    assert isinstance(embedding, SentenceTransformersEmbedding)
    assert isinstance(cross_encoder, SentenceTransformersCrossEncoder)
    assert (embedding.task, cross_encoder.task) == ("embedding", "reranking")
    assert [adapter.name for adapter in registered_adapters()] == [
        EMBEDDING,
        CROSS_ENCODER,
        "transformers_whisper",
        "transformers_trocr",
        "transformers_siglip2",
        "transformers_causal_lm",
        "llama_cpp_server",
        "vllm_server",
    ]
    assert all(isinstance(adapter, RuntimeAdapter) for adapter in registered_adapters())


def test_an_empty_name_is_the_embedding_adapter_of_older_deployments() -> None:
    assert DEFAULT_ADAPTER == EMBEDDING
    assert runtime_adapter_for("") is runtime_adapter_for(EMBEDDING)


def test_an_unknown_adapter_is_runtime_incompatible_naming_the_supported_ones() -> None:
    with pytest.raises(GantryError) as raised:
        runtime_adapter_for("vllm")
    error = raised.value
    assert (error.reason, error.failure_class) == ("RUNTIME_INCOMPATIBLE", FailureClass.CONFIG)
    assert error.metadata == {"adapter": "vllm"}
    assert error.message == (
        "adapter 'vllm' is not supported; supported: llama_cpp_server, "
        "sentence_transformers, sentence_transformers_cross_encoder, transformers_causal_lm, "
        "transformers_siglip2, transformers_trocr, transformers_whisper, vllm_server"
    )


def test_only_the_embedding_adapter_runs_an_embedding_inspection() -> None:
    assert _supported(EMBEDDING_INSPECTION) == [EMBEDDING]
    refused = runtime_adapter_for(CROSS_ENCODER).inspect_support(EMBEDDING_INSPECTION)
    assert (refused.adapter, refused.supported) == (CROSS_ENCODER, False)
    assert refused.reason == "runs reranking models, not embedding"


def test_only_the_cross_encoder_runs_a_one_label_reranker() -> None:
    assert _supported(CROSS_ENCODER_INSPECTION) == [CROSS_ENCODER]
    refused = runtime_adapter_for(EMBEDDING).inspect_support(CROSS_ENCODER_INSPECTION)
    assert (refused.supported, refused.reason) == (False, "runs embedding models, not reranking")


def test_a_reranker_with_two_labels_is_run_by_no_adapter() -> None:
    two_labels = wg.Inspection()
    two_labels.CopyFrom(CROSS_ENCODER_INSPECTION)
    two_labels.details["num_labels"] = "2"
    assert _supported(two_labels) == []
    refused = runtime_adapter_for(CROSS_ENCODER).inspect_support(two_labels)
    assert refused.reason == "reranking needs exactly one score per pair; num_labels=2"


def test_a_gguf_inspection_is_run_by_the_llama_cpp_server_only_and_the_others_say_why() -> None:
    assert _supported(GGUF_INSPECTION) == ["llama_cpp_server"]
    reasons = {
        adapter.name: adapter.inspect_support(GGUF_INSPECTION).reason
        for adapter in registered_adapters()
        if adapter.name not in ("llama_cpp_server", "vllm_server")
    }
    assert reasons == {
        EMBEDDING: "runs sentence-transformers layouts, not gguf",
        CROSS_ENCODER: "runs sentence-transformers layouts, not gguf",
        "transformers_whisper": "runs transformers layouts, not gguf",
        "transformers_trocr": "runs transformers layouts, not gguf",
        "transformers_siglip2": "runs transformers layouts, not gguf",
        "transformers_causal_lm": "runs transformers layouts, not gguf",
    }


def test_runtime_facts_with_the_packages_say_available_with_their_versions() -> None:
    facts = {
        "versions": {
            "python": "3.11.9",
            "torch": "2.5.1",
            "transformers": "4.46.0",
            "sentence-transformers": "3.3.1",
        },
        "adapters": [EMBEDDING, CROSS_ENCODER],
    }
    for name in (EMBEDDING, CROSS_ENCODER):
        found = runtime_adapter_for(name).collect_runtime_facts(facts)
        assert (found.adapter, found.available, found.reason) == (name, True, "")
        assert found.modalities == ("text",)
        assert dict(found.versions) == {
            "sentence-transformers": "3.3.1",
            "torch": "2.5.1",
            "transformers": "4.46.0",
        }


def test_runtime_facts_without_the_package_say_unavailable_and_what_is_missing() -> None:
    facts = {"versions": {"python": "3.11.9", "torch": "2.5.1"}, "adapters": []}
    found = runtime_adapter_for(EMBEDDING).collect_runtime_facts(facts)
    assert (found.available, dict(found.versions)) == (False, {"torch": "2.5.1"})
    assert found.reason == (
        "adapter 'sentence_transformers' needs sentence-transformers, torch, transformers: "
        "missing sentence-transformers, transformers"
    )


def test_a_cross_encoder_the_installed_package_cannot_run_is_unavailable() -> None:
    # sentence-transformers is there but exports no CrossEncoder: the script lists only one.
    facts = {
        "versions": {"torch": "2.5.1", "transformers": "4.46.0", "sentence-transformers": "2.0.0"},
        "adapters": [EMBEDDING],
    }
    assert runtime_adapter_for(EMBEDDING).collect_runtime_facts(facts).available
    found = runtime_adapter_for(CROSS_ENCODER).collect_runtime_facts(facts)
    assert not found.available
    assert found.reason.endswith(": the facts script did not find it importable")


def test_a_malformed_facts_answer_is_unavailable_not_an_error() -> None:
    found = runtime_adapter_for(EMBEDDING).collect_runtime_facts({"adapters": "everything"})
    assert (found.available, dict(found.versions)) == (False, {})


class _FakeHost:
    """A model host that answers at once: enough to walk health and stop without a child."""

    def __init__(self, *, exits_on_stop: bool = True) -> None:
        self.pid = 4242
        self.returncode: int | None = None
        self.unloaded: model_host_pb2.HostUnloaded | None = None
        self.ready = model_host_pb2.HostReady(load_seconds=0.5)
        self.calls: list[str] = []
        self._exits_on_stop = exits_on_stop

    async def ping(self, *, timeout_s: float) -> model_host_pb2.Pong:
        self.calls.append("ping")
        return model_host_pb2.Pong()

    async def check_model(self, *, timeout_s: float) -> wg.HealthReport:
        self.calls.append("check_model")
        return wg.HealthReport(model=wg.HealthLayer(status=wg.HEALTH_STATUS_OK, detail="finite"))

    async def probe_check(self, *, timeout_s: float) -> model_host_pb2.ProbeResult:
        raise GantryError("DEADLINE_EXCEEDED", "no answer")

    async def stop(self, *, grace_s: float = 10.0) -> wg.UnloadEvidence:
        self.calls.append("stop")
        return self._ended(exited=self._exits_on_stop)

    async def kill(self) -> wg.UnloadEvidence:
        self.calls.append("kill")
        return self._ended(exited=True, signal_number=9)

    def _ended(self, *, exited: bool, signal_number: int = 0) -> wg.UnloadEvidence:
        if not exited:
            return wg.UnloadEvidence(pid=self.pid)
        self.returncode = -signal_number if signal_number else 0
        if signal_number:
            return wg.UnloadEvidence(pid=self.pid, process_exited=True, exit_signal=signal_number)
        return wg.UnloadEvidence(pid=self.pid, process_exited=True, has_exit_code=True)


def _running(host: _FakeHost) -> HostRunning:
    return HostRunning(
        adapter=EMBEDDING, pid=host.pid, load_seconds=0.5, runtime_versions={}, host=host
    )


async def test_health_pings_and_runs_the_model_only_when_deep() -> None:
    adapter, host = runtime_adapter_for(EMBEDDING), _FakeHost()
    shallow = (await adapter.health(_running(host), deep=False, timeout_s=1.0)).report
    assert (shallow.process.status, shallow.runtime.status, shallow.model.status) == (
        wg.HEALTH_STATUS_OK,
        wg.HEALTH_STATUS_OK,
        wg.HEALTH_STATUS_NOT_CHECKED,
    )
    deep = (await adapter.health(_running(host), deep=True, timeout_s=1.0)).report
    assert (deep.model.status, deep.model.detail) == (wg.HEALTH_STATUS_OK, "finite")
    assert host.calls == ["ping", "ping", "check_model"]


async def test_a_probe_check_without_an_answer_is_health_failed() -> None:
    with pytest.raises(GantryError) as raised:
        await runtime_adapter_for(EMBEDDING).probe(_running(_FakeHost()), timeout_s=1.0)
    assert raised.value.reason == "HEALTH_FAILED"


async def test_stop_kills_again_until_the_process_is_confirmed_gone() -> None:
    adapter = runtime_adapter_for(EMBEDDING)
    lingering = _FakeHost(exits_on_stop=False)
    stopped = await adapter.stop(_running(lingering), grace_s=1.0)
    assert (lingering.calls, stopped.process_exited) == (["stop", "kill"], True)
    at_once = _FakeHost()
    await adapter.stop(_running(at_once), grace_s=0)
    assert at_once.calls == ["kill"]


async def test_unload_reports_the_exit_and_the_reclaim() -> None:
    host = _FakeHost()
    unloaded = await runtime_adapter_for(EMBEDDING).unload(
        _running(host), grace_s=1.0, nvml=Nvml(None, "no NVML in this test")
    )
    assert unloaded.stopped == wg.UnloadEvidence(pid=4242, process_exited=True, has_exit_code=True)
    assert (unloaded.reclaim.process_exited, unloaded.reclaim.reaped) == (True, True)
    assert unloaded.cuda_allocated_after_unload.unavailable == (
        "the model host sent no HostUnloaded before exiting"
    )

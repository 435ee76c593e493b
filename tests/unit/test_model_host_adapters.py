"""The model host's adapter registry, its refusals, and the readings it takes of itself."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gantry.common.errors import FailureClass, GantryError
from gantry.v1 import common_pb2, model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.model_host import proc_facts
from gantry.worker.model_host.adapters import ADAPTERS, adapter_for
from gantry.worker.model_host.adapters.cross_encoder import SentenceTransformersCrossEncoder
from gantry.worker.model_host.adapters.sentence_transformers_embedding import (
    SentenceTransformersEmbedding,
)
from gantry.worker.model_host.framing import read_frame
from gantry.worker.model_host.inbox import Inbox, Queued, ResponseWriter
from gantry.worker.model_host.landlock import Isolation, IsolationLevel
from gantry.worker.model_host.memory_readings import CudaAllocator
from gantry.worker.model_host.probe_evidence import LoadRecord, network_guard_installed
from gantry.worker.model_host.serving import ModelServer, ServingSettings


def test_the_registry_names_exactly_the_executable_adapters() -> None:
    assert sorted(ADAPTERS) == [
        "sentence_transformers",
        "sentence_transformers_cross_encoder",
        "transformers_whisper",
    ]
    assert isinstance(adapter_for("sentence_transformers"), SentenceTransformersEmbedding)
    assert isinstance(
        adapter_for("sentence_transformers_cross_encoder"), SentenceTransformersCrossEncoder
    )
    # Deployments from before adapters were named carry none: they are embedding deployments.
    assert isinstance(adapter_for(""), SentenceTransformersEmbedding)
    # Each call is a fresh adapter: no model is shared between hosts.
    assert adapter_for("sentence_transformers") is not adapter_for("sentence_transformers")


@pytest.mark.parametrize("name", ["llama_cpp", "vllm", "diffusers", "SENTENCE_TRANSFORMERS", " "])
def test_an_unknown_adapter_is_runtime_incompatible_naming_the_supported_ones(name: str) -> None:
    with pytest.raises(GantryError) as caught:
        adapter_for(name)
    error = caught.value
    assert error.reason == "RUNTIME_INCOMPATIBLE"
    assert error.failure_class is FailureClass.CONFIG
    assert repr(name) in error.message
    assert "sentence_transformers, sentence_transformers_cross_encoder" in error.message
    assert error.metadata == {"adapter": name}


def test_a_request_kind_the_adapter_does_not_serve_is_a_typed_refusal() -> None:
    with pytest.raises(GantryError) as caught:
        SentenceTransformersEmbedding().rerank("query", ["document"])
    assert caught.value.reason == "INVALID_PAYLOAD"
    assert "cannot answer rerank requests" in caught.value.message
    with pytest.raises(GantryError) as caught:
        SentenceTransformersCrossEncoder().embed(["text"])
    assert caught.value.reason == "INVALID_PAYLOAD"
    assert "cannot answer embed requests" in caught.value.message


def test_every_adapter_records_offline_flags_and_serves_one_kind() -> None:
    for adapter in ADAPTERS.values():
        assert adapter.local_files_only is True
        assert adapter.trust_remote_code is False
        assert len(adapter.serves) == 1


def test_loading_a_missing_directory_fails_before_any_library_is_asked(tmp_path: Path) -> None:
    for name in ADAPTERS:
        with pytest.raises(GantryError) as caught:
            adapter_for(name).load(tmp_path / "absent", common_pb2.AdapterSettings(adapter=name))
        assert caught.value.reason == "LOAD_FAILED"
        assert "does not exist" in caught.value.message


def test_importing_the_registry_and_child_pulls_in_no_ml_library_or_thread() -> None:
    # The child imports these before it enters its single-threaded sandbox.
    code = (
        "import sys, threading\n"
        "import gantry.worker.model_host.adapters, gantry.worker.model_host.child\n"
        "heavy = sorted(m for m in ('numpy', 'torch', 'transformers', 'sentence_transformers')"
        " if m in sys.modules)\n"
        "print(heavy, threading.active_count())\n"
    )
    completed = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    )
    assert completed.stdout.strip() == "[] 1"


# ---- readings ------------------------------------------------------------------------------


def test_rss_is_read_from_the_kernel_current_and_peak_apart() -> None:
    current = proc_facts.rss_bytes_of()
    peak = proc_facts.peak_rss_bytes_of()
    assert current is not None and peak is not None
    assert peak >= current > 0
    assert proc_facts.status_bytes("NoSuchField") is None
    assert proc_facts.rss_bytes_of(2**22 + 12345) is None  # no such pid: unreadable, not zero


def test_cuda_readings_say_why_they_are_unavailable() -> None:
    for device in ("cpu", ""):
        cpu = CudaAllocator(device)
        assert not cpu.available
        for reading in (cpu.allocated(), cpu.reserved(), cpu.peak_allocated()):
            assert reading.WhichOneof("value") == "unavailable"
            assert reading.unavailable == "device is cpu"
            assert reading.source.startswith("torch.cuda.")

    import torch

    cuda = CudaAllocator("cuda")
    if torch.cuda.is_available():
        assert cuda.available
        assert cuda.allocated().WhichOneof("value") == "bytes"
    else:
        assert cuda.allocated().unavailable == "torch.cuda.is_available() is false"


def test_network_guard_is_reported_only_once_installed() -> None:
    script = (
        "from gantry.worker.model_host import hardening, probe_evidence as p\n"
        "before = p.network_guard_installed()\n"
        "hardening.install_network_guard()\n"
        "print(before, p.network_guard_installed())\n"
    )
    completed = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, check=True
    )
    assert completed.stdout.strip() == "False True"
    assert network_guard_installed() is False  # this test process never installed it


# ---- the serving loop with a stand-in model ------------------------------------------------


class _Scorer:
    """Stands in for a CrossEncoder: a document's score is its length."""

    device = "cpu"

    def predict(self, pairs: list[tuple[str, str]], **_: object) -> np.ndarray:
        return np.array([float(len(document)) for _, document in pairs], dtype=np.float32)


def _record() -> LoadRecord:
    unmeasured = common_pb2.Measurement(unavailable="device is cpu", source="torch.cuda")
    return LoadRecord(
        isolation=Isolation(level=IsolationLevel.NONE, reason="unit test"),
        cuda=CudaAllocator("cpu"),
        cuda_allocated_before_load=unmeasured,
        cuda_allocated_after_load=unmeasured,
        cuda_reserved_after_load=unmeasured,
        first_invoke_seconds=0.25,
    )


def _serve(requests: list[model_host_pb2.HostRequest]) -> dict[int, model_host_pb2.HostResponse]:
    adapter = SentenceTransformersCrossEncoder()
    adapter._model = _Scorer()  # what `load` would have set
    inbox = Inbox(limit=16)
    stream = io.BytesIO()
    server = ModelServer(
        deployment_id="dep-unit",
        adapter=adapter,
        record=_record(),
        settings=ServingSettings(max_batch_inputs=8, test_hooks=False),
        inbox=inbox,
        responses=ResponseWriter(stream),
    )
    for request in requests:
        inbox.offer(Queued(request, None))
    assert server.serve() == 0
    stream.seek(0)
    answers = {}
    while (payload := read_frame(stream)) is not None:
        response = model_host_pb2.HostResponse.FromString(payload)
        answers[response.request_id] = response
    return answers


def test_cross_encoder_server_scores_refuses_embeds_answers_probes_and_unloads() -> None:
    answers = _serve(
        [
            model_host_pb2.HostRequest(
                request_id=1,
                rerank=wg.RerankPayload(query="q", documents=["aaa", "a", "aa"]),
            ),
            model_host_pb2.HostRequest(request_id=2, embed=wg.EmbedPayload(inputs=["x"])),
            model_host_pb2.HostRequest(request_id=3, rerank=wg.RerankPayload(query="q")),
            model_host_pb2.HostRequest(request_id=4, probe_check=model_host_pb2.ProbeCheck()),
            model_host_pb2.HostRequest(request_id=5, shutdown=model_host_pb2.Shutdown()),
        ]
    )
    assert list(answers[1].rerank.scores) == [3.0, 1.0, 2.0]  # the documents' order, not ranked
    assert answers[2].failure.reason == "INVALID_PAYLOAD"
    assert "dep-unit" in answers[2].failure.message
    assert "sentence_transformers_cross_encoder" in answers[2].failure.message
    assert answers[3].failure.reason == "INVALID_PAYLOAD"

    probe = answers[4].probe
    assert probe.health.model.status == wg.HEALTH_STATUS_OK
    assert probe.health.capability.status == wg.HEALTH_STATUS_NOT_CHECKED
    assert probe.health.capability.detail == "NOT_ROUTED"
    assert list(probe.output_shape) == [1]
    assert probe.output_finite
    assert probe.first_invoke_seconds == 0.25  # measured at load, not now
    assert probe.memory.rss_peak.bytes >= probe.memory.rss_current.bytes > 0
    assert probe.memory.cuda_peak_allocated.unavailable == "device is cpu"
    assert probe.offline.isolation == "NONE"
    assert probe.offline.isolation_reason == "unit test"
    assert not probe.memory.HasField("nvml_device_total")

    assert answers[5].unloaded.cuda_allocated_after_unload.unavailable == "device is cpu"


def test_a_non_finite_score_fails_the_probe_model_layer() -> None:
    class _NanScorer(_Scorer):
        def predict(self, pairs: list[tuple[str, str]], **_: object) -> np.ndarray:
            return np.array([np.nan] * len(pairs), dtype=np.float32)

    adapter = SentenceTransformersCrossEncoder()
    adapter._model = _NanScorer()
    check = adapter.health_check()
    assert not check.ok
    assert check.problem == "probe returned non-finite values"
    assert check.shape == (1,) and not check.finite

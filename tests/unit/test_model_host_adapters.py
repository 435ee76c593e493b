"""The model host's adapter registry, its refusals, and the readings it takes of itself.

What its modules do to a fresh interpreter, read from a child process:
tests/integration/test_model_host_adapters_fresh_interpreter.py.
"""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gantry.common.errors import FailureClass, GantryError
from gantry.v1 import common_pb2, model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.model_host import proc_facts
from gantry.worker.model_host.adapters import ADAPTERS, adapter_for
from gantry.worker.model_host.adapters.cross_encoder import SentenceTransformersCrossEncoder
from gantry.worker.model_host.adapters.image_inputs import (
    check_preprocessing,
    processor_image_size,
)
from gantry.worker.model_host.adapters.sentence_transformers_embedding import (
    SentenceTransformersEmbedding,
)
from gantry.worker.model_host.adapters.siglip2 import TransformersSiglip2
from gantry.worker.model_host.adapters.trocr import TransformersTrOCR
from gantry.worker.model_host.framing import read_frame
from gantry.worker.model_host.host_answers import checked_classify_image, checked_recognize_text
from gantry.worker.model_host.inbox import Inbox, Queued, ResponseWriter
from gantry.worker.model_host.landlock import Isolation, IsolationLevel
from gantry.worker.model_host.memory_readings import CudaAllocator
from gantry.worker.model_host.probe_evidence import LoadRecord
from gantry.worker.model_host.serving import SERVED_KINDS, ModelServer, ServingSettings


def test_the_registry_names_exactly_the_executable_adapters() -> None:
    assert sorted(ADAPTERS) == [
        "sentence_transformers",
        "sentence_transformers_cross_encoder",
        "transformers_causal_lm",
        "transformers_siglip2",
        "transformers_trocr",
        "transformers_whisper",
    ]
    assert isinstance(adapter_for("sentence_transformers"), SentenceTransformersEmbedding)
    assert isinstance(adapter_for("transformers_trocr"), TransformersTrOCR)
    assert isinstance(adapter_for("transformers_siglip2"), TransformersSiglip2)
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
    # The image kinds, on adapters that take no images (and on the one that reads text).
    for adapter, call, kind in (
        (SentenceTransformersEmbedding(), lambda a: a.embed_image([]), "embed_image"),
        (SentenceTransformersCrossEncoder(), lambda a: a.recognize_text([]), "recognize_text"),
        (TransformersTrOCR(), lambda a: a.classify_image([], ["label"]), "classify_image"),
        (TransformersSiglip2(), lambda a: a.recognize_text([]), "recognize_text"),
    ):
        with pytest.raises(GantryError) as caught:
            call(adapter)
        assert caught.value.reason == "INVALID_PAYLOAD"
        assert f"cannot answer {kind} requests" in caught.value.message
        assert caught.value.metadata == {"adapter": adapter.name}


def test_every_adapter_records_offline_flags_and_serves_kinds_the_host_routes() -> None:
    for adapter in ADAPTERS.values():
        assert adapter.local_files_only is True
        assert adapter.trust_remote_code is False
        assert adapter.serves and adapter.serves <= SERVED_KINDS
    # One kind each, but SigLIP2: texts and images in one space, and labels scored against images.
    assert TransformersTrOCR.serves == {"recognize_text"}
    assert TransformersSiglip2.serves == {"embed", "embed_image", "classify_image"}


def test_loading_a_missing_directory_fails_before_any_library_is_asked(tmp_path: Path) -> None:
    for name in ADAPTERS:
        with pytest.raises(GantryError) as caught:
            adapter_for(name).load(tmp_path / "absent", common_pb2.AdapterSettings(adapter=name))
        assert caught.value.reason == "LOAD_FAILED"
        assert "does not exist" in caught.value.message


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


# ---- the serving loop with a stand-in model ------------------------------------------------


class _Scorer:
    """Stands in for a CrossEncoder, as the adapter's pass uses one: a document's score is its
    length, with no activation."""

    device = "cpu"
    prompts: dict[str, str] = {}
    default_prompt_name = None
    activation_fn = None

    def score(self, document: str) -> float:
        return float(len(document))

    def preprocess(
        self, pairs: list[tuple[str, str]], prompt: str | None = None
    ) -> dict[str, object]:
        return {"pairs": pairs}

    def __call__(self, features: dict[str, object]) -> dict[str, object]:
        import torch

        pairs = features["pairs"]
        assert isinstance(pairs, list)
        return {"scores": torch.tensor([[self.score(document)] for _, document in pairs])}


def _record() -> LoadRecord:
    unmeasured = common_pb2.Measurement(unavailable="device is cpu", source="torch.cuda")
    return LoadRecord(
        isolation=Isolation(level=IsolationLevel.NONE, reason="unit test"),
        model_directory=Path("/unit-test/model"),
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
        def score(self, document: str) -> float:
            return float("nan")

    adapter = SentenceTransformersCrossEncoder()
    adapter._model = _NanScorer()
    check = adapter.health_check()
    assert not check.ok
    assert check.problem == "probe returned non-finite values"
    assert check.shape == (1,) and not check.finite


def test_image_kinds_on_a_host_that_takes_no_images_are_refused_by_kind() -> None:
    image = common_pb2.Image(data=b"\x89PNG\r\n\x1a\n", media_type="image/png")
    answers = _serve(
        [
            model_host_pb2.HostRequest(
                request_id=1, recognize_text=wg.RecognizeTextPayload(images=[image])
            ),
            model_host_pb2.HostRequest(request_id=2, embed_image=wg.EmbedImagePayload()),
            model_host_pb2.HostRequest(
                request_id=3, classify_image=wg.ClassifyImagePayload(labels=["a cat"])
            ),
            model_host_pb2.HostRequest(request_id=4, shutdown=model_host_pb2.Shutdown()),
        ]
    )
    for request_id, kind in ((1, "recognize_text"), (2, "embed_image"), (3, "classify_image")):
        failure = answers[request_id].failure
        assert failure.reason == "INVALID_PAYLOAD"
        assert f"cannot answer {kind} requests" in failure.message
        assert failure.metadata["adapter"] == "sentence_transformers_cross_encoder"


# ---- image preprocessing: the artifact's processor against the deployment's record ----------


def _vit_processor(**overrides: object) -> SimpleNamespace:
    """Stands in for a ViTImageProcessor: the attributes the check reads."""
    fields: dict[str, object] = {
        "size": {"height": 384, "width": 384},
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
    fields.update(overrides)
    return SimpleNamespace(**fields)


def _settings(
    *, image_size: int = 0, image_mean: tuple[float, ...] = (), image_std: tuple[float, ...] = ()
) -> common_pb2.AdapterSettings:
    return common_pb2.AdapterSettings(
        adapter="transformers_trocr",
        image_size=image_size,
        image_mean=image_mean,
        image_std=image_std,
    )


def test_a_processor_s_image_size_is_the_square_it_hands_the_model() -> None:
    assert processor_image_size(_vit_processor()) == 384
    assert processor_image_size(_vit_processor(size=SimpleNamespace(height=224, width=224))) == 224
    assert processor_image_size(_vit_processor(size=224)) == 224
    assert processor_image_size(_vit_processor(size={"height": 32, "width": 64})) is None
    assert processor_image_size(_vit_processor(size={"shortest_edge": 256})) is None
    center_crop = _vit_processor(
        size={"shortest_edge": 256}, do_center_crop=True, crop_size={"height": 224, "width": 224}
    )
    assert processor_image_size(center_crop) == 224
    naflex = SimpleNamespace(size=None, patch_size=16, max_num_patches=256)  # SigLIP2
    assert processor_image_size(naflex) is None


def test_preprocessing_that_agrees_or_is_unset_loads() -> None:
    check_preprocessing(_settings(), _vit_processor(), adapter="transformers_trocr")
    # float32 settings against the processor's float64 JSON values.
    clip_mean = [0.48145466, 0.4578275, 0.40821073]
    agreed = _settings(
        image_size=384,
        image_mean=tuple(float(np.float32(value)) for value in clip_mean),
        image_std=(0.5, 0.5, 0.5),
    )
    check_preprocessing(agreed, _vit_processor(image_mean=clip_mean), adapter="transformers_trocr")
    # One value for every channel is three equal ones.
    check_preprocessing(
        _settings(image_std=(0.5, 0.5, 0.5)), _vit_processor(image_std=0.5), adapter="x"
    )


def test_preprocessing_that_disagrees_is_runtime_incompatible_naming_every_setting() -> None:
    with pytest.raises(GantryError) as caught:
        check_preprocessing(
            _settings(image_size=224, image_mean=(0.5, 0.5, 0.5), image_std=(0.2, 0.2, 0.2)),
            _vit_processor(),
            adapter="transformers_trocr",
        )
    error = caught.value
    assert error.reason == "RUNTIME_INCOMPATIBLE" and error.failure_class is FailureClass.CONFIG
    assert error.metadata == {
        "adapter": "transformers_trocr",
        "field": "adapter.image_size,adapter.image_std",
    }
    assert "image_size is 384 in the artifact, 224 in the deployment's settings" in error.message
    assert "image_std is 0.5, 0.5, 0.5 in the artifact, 0.2, 0.2, 0.2" in error.message
    # A NaFlex processor has no fixed size: any recorded size is a disagreement.
    naflex = SimpleNamespace(
        size=None, patch_size=16, max_num_patches=256, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    with pytest.raises(GantryError) as caught:
        check_preprocessing(_settings(image_size=256), naflex, adapter="transformers_siglip2")
    assert "no fixed square size" in caught.value.message
    with pytest.raises(GantryError) as caught:
        check_preprocessing(
            _settings(image_mean=(0.5, 0.5)), _vit_processor(), adapter="transformers_trocr"
        )
    assert caught.value.metadata["field"] == "adapter.image_mean"


# ---- the worker's checks of the host's image answers -----------------------------------------


def test_a_recognize_text_answer_needs_one_text_per_image() -> None:
    answer = model_host_pb2.HostResponse(
        recognize_text=wg.RecognizeTextResult(texts=["one", "two"])
    )
    assert list(checked_recognize_text(answer, image_count=2).texts) == ["one", "two"]
    with pytest.raises(GantryError) as caught:
        checked_recognize_text(answer, image_count=3)
    assert caught.value.reason == "INVOKE_FAILED" and "2 texts for 3 images" in caught.value.message
    refused = model_host_pb2.HostResponse(
        failure=GantryError("INVALID_PAYLOAD", "bad", field="images[0]").to_failure()
    )
    with pytest.raises(GantryError) as caught:
        checked_recognize_text(refused, image_count=1)
    assert caught.value.reason == "INVALID_PAYLOAD"
    assert caught.value.metadata == {"field": "images[0]"}
    with pytest.raises(GantryError) as caught:
        checked_recognize_text(model_host_pb2.HostResponse(embed=wg.EmbedResult()), image_count=1)
    assert caught.value.reason == "INVOKE_FAILED"


@pytest.mark.parametrize(
    ("count", "labels", "scores", "problem"),
    [
        (2, 2, [0.1, 0.9, 0.5, 1.0], None),
        (2, 2, [0.1, 0.9, 0.5], "3 scores for 2 images and 2 labels"),
        (1, 2, [0.1, 0.9, 0.5, 1.0], "1x2 with 4 scores"),
        (2, 2, [0.1, 0.9, 1.5, 0.0], "score 1.5 for image 1, label 0"),
        (2, 2, [0.1, float("nan"), 0.5, 0.0], "for image 0, label 1: not a probability"),
        (2, 2, [-0.1, 0.9, 0.5, 0.0], "not a probability"),
    ],
)
def test_a_classify_answer_needs_a_probability_for_every_image_and_label(
    count: int, labels: int, scores: list[float], problem: str | None
) -> None:
    answer = model_host_pb2.HostResponse(
        classify_image=wg.ClassifyImageResult(count=count, labels=labels, scores=scores)
    )
    if problem is None:
        assert checked_classify_image(answer, image_count=2, label_count=2).count == 2
        return
    with pytest.raises(GantryError) as caught:
        checked_classify_image(answer, image_count=2, label_count=2)
    assert caught.value.reason == "INVOKE_FAILED"
    assert problem in caught.value.message


# ---- SigLIP2's text side ----------------------------------------------------------------------


def _siglip2_text_side(*, token_limit: int) -> TransformersSiglip2:
    """A SigLIP2 adapter holding the fixture's real tokenizer, and no model (a stand-in)."""
    from tests.fixtures.tiny_siglip2 import TEXT_POSITIONS, siglip2_tokenizer

    adapter = TransformersSiglip2()
    adapter._tokenizer = siglip2_tokenizer()
    adapter._positions = TEXT_POSITIONS
    adapter._token_limit = token_limit
    adapter._model = SimpleNamespace(device="cpu")  # what `load` would have set
    return adapter


def test_siglip2_texts_are_padded_to_the_tower_and_cut_at_the_token_limit() -> None:
    adapter = _siglip2_text_side(token_limit=64)
    assert adapter.token_limit == 64
    assert adapter.embed_token_counts(["a cat", "x" * 100]) == [5, 100]
    batch = adapter.text_inputs(["a cat", "x" * 100])
    assert tuple(batch["input_ids"].shape) == (2, 64)  # padded as SigLIP was trained
    assert batch["attention_mask"][0].tolist() == [1] * 5 + [0] * 59
    assert batch["attention_mask"][1].tolist() == [1] * 64  # cut (a truncate request)

    # A lower max_input_length: a text is cut there, and still padded to the tower's 64.
    lower = _siglip2_text_side(token_limit=8)
    cut = lower.text_inputs(["a cat", "x" * 100])
    assert tuple(cut["input_ids"].shape) == (2, 64)
    assert cut["attention_mask"][1].tolist() == [1] * 8 + [0] * 56
    assert cut["input_ids"][0].tolist() == batch["input_ids"][0].tolist()

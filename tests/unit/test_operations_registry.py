"""The operation registry (gantry.common.operations) agrees with the wire contracts it names, and
every layer finds each operation through it: the control plane's bindings, the worker's Invoke and
result fields, the model host's request and response kinds."""

from __future__ import annotations

import pytest

from gantry.common import operations
from gantry.common.errors import GantryError
from gantry.controlplane.serving.inference_service import InferenceService
from gantry.controlplane.serving.operations import HANDLED_ELSEWHERE, PREPARED
from gantry.v1 import common_pb2, inference_pb2, model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.managed_server.kinds import LLAMA_CPP_SERVER, SERVER_KINDS
from gantry.worker.managed_server.server_calls import ServerCalls
from gantry.worker.model_host.host_answers import ANSWER_CHECKS
from gantry.worker.model_host.host_calls import HostCalls
from gantry.worker.model_host.inbox import WORK_KINDS
from gantry.worker.model_host.serving import SERVED_KINDS

INFERENCE = inference_pb2.DESCRIPTOR.services_by_name["Inference"]


def _oneof_fields(message: type, oneof: str) -> dict[str, str]:
    """field name -> its message type's full name, for one oneof of `message`."""
    return {
        field.name: field.message_type.full_name
        for field in message.DESCRIPTOR.oneofs_by_name[oneof].fields  # type: ignore[attr-defined]
        if field.message_type is not None
    }


def test_there_is_one_entry_per_inference_rpc_in_the_order_the_proto_declares_them() -> None:
    assert [operation.rpc for operation in operations.OPERATIONS] == [
        method.name for method in INFERENCE.methods
    ]


@pytest.mark.parametrize("operation", operations.OPERATIONS, ids=lambda op: op.rpc)
def test_each_entry_names_its_rpc_messages_as_the_proto_does(
    operation: operations.Operation,
) -> None:
    method = INFERENCE.methods_by_name[operation.rpc]
    assert method.input_type is operation.request_type.DESCRIPTOR
    assert method.output_type is operation.response_type.DESCRIPTOR
    assert method.server_streaming is operation.streaming


@pytest.mark.parametrize("operation", operations.OPERATIONS, ids=lambda op: op.rpc)
def test_each_kind_is_the_field_its_payload_and_result_travel_in_at_every_hop(
    operation: operations.Operation,
) -> None:
    payload = operation.payload_type.DESCRIPTOR.full_name
    result = operation.result_type.DESCRIPTOR.full_name
    assert _oneof_fields(wg.Invoke, "payload")[operation.kind] == payload
    assert _oneof_fields(model_host_pb2.HostRequest, "kind")[operation.kind] == payload
    assert _oneof_fields(wg.InvokeResult, "outcome")[operation.result_kind] == result
    assert _oneof_fields(model_host_pb2.HostResponse, "kind")[operation.result_kind] == result


def test_metric_labels_and_span_names_stay_what_they_were() -> None:
    declared = {op.rpc: op.span_name for op in operations.OPERATIONS}
    assert (
        declared.items()
        >= {
            "Embed": "controlplane.embed",
            "Rerank": "controlplane.rerank",
            "Transcribe": "controlplane.transcribe",
            "RecognizeText": "controlplane.recognize_text",
            "EmbedImage": "controlplane.embed_image",
            "ClassifyImage": "controlplane.classify_image",
            "Generate": "controlplane.generate",
            "GenerateStream": "controlplane.generate_stream",
        }.items()
    )


def test_lookups_find_each_operation_by_rpc_kind_and_payload() -> None:
    assert operations.by_rpc("ClassifyImage") is operations.CLASSIFY_IMAGE
    assert operations.by_kind("embed_image") is operations.EMBED_IMAGE
    assert operations.of_payload(wg.EmbedImagePayload()) is operations.EMBED_IMAGE
    # One payload, two RPCs: the payload's own `stream` tells them apart.
    assert operations.by_kind("generate") is operations.GENERATE
    assert operations.of_payload(wg.GeneratePayload()) is operations.GENERATE
    assert operations.of_payload(wg.GeneratePayload(stream=True)) is operations.GENERATE_STREAM
    assert operations.STREAMING_KINDS == {"generate"}
    with pytest.raises(KeyError):
        operations.of_payload(wg.Invoke())


def test_cli_verbs_are_listed_once_each_with_todays_help() -> None:
    verbs = operations.cli_verbs()
    assert list(verbs) == ["embed", "transcribe", "ocr", "embed-image", "classify", "generate"]
    assert verbs["generate"] == (
        "generate text from a prompt (GenerateStream, Generate)",
        (operations.GENERATE, operations.GENERATE_STREAM),
    )
    assert verbs["ocr"][0] == "read the line of text in each image (RecognizeText)"


def test_every_operation_has_exactly_one_control_plane_binding_and_a_servicer_method() -> None:
    assert set(PREPARED) | HANDLED_ELSEWHERE == set(operations.BY_RPC)
    assert not set(PREPARED) & HANDLED_ELSEWHERE
    for operation in operations.OPERATIONS:
        method = getattr(InferenceService, operation.rpc)
        assert method.__name__ == operation.rpc


def test_the_model_host_serves_and_queues_every_kind_and_checks_each_answer() -> None:
    assert SERVED_KINDS == operations.KINDS
    assert operations.KINDS <= WORK_KINDS
    # Every kind of the first eight operations has a check beyond its kind; one added later may
    # be checked for its kind alone.
    assert set(ANSWER_CHECKS) <= operations.KINDS
    assert {op.kind for op in operations.OPERATIONS[:8]} <= set(ANSWER_CHECKS)


class _ScriptedHost(HostCalls):
    """HostCalls over a scripted child: records each request, answers with `answer`."""

    def __init__(self, answer: model_host_pb2.HostResponse) -> None:
        self.sent: list[model_host_pb2.HostRequest] = []
        self._answer = answer

    @property
    def ready(self) -> model_host_pb2.HostReady:
        return model_host_pb2.HostReady(dim=1)

    async def _call(  # type: ignore[override]
        self, request: model_host_pb2.HostRequest, **_: object
    ) -> model_host_pb2.HostResponse:
        self.sent.append(request)
        return self._answer


async def test_a_host_is_asked_in_its_kinds_field_and_its_answer_is_checked_by_kind() -> None:
    image = common_pb2.Image(data=b"\x89PNG", media_type="image/png")
    vector = wg.EmbedResult(count=1, dim=1, float32_le=b"\x00\x00\x80?")
    host = _ScriptedHost(model_host_pb2.HostResponse(embed=vector))
    payload = wg.EmbedImagePayload(images=[image])
    answer = await host.invoke("embed_image", payload, trace_context={"t": "1"}, timeout_s=1.0)
    assert answer == vector
    assert host.sent[0].WhichOneof("kind") == "embed_image"
    assert host.sent[0].embed_image == payload
    # Two images answered with one vector: refused, never passed on.
    with pytest.raises(GantryError) as refused:
        await host.invoke(
            "embed_image",
            wg.EmbedImagePayload(images=[image, image]),
            trace_context={},
            timeout_s=1,
        )
    assert refused.value.reason == "INVOKE_FAILED"


async def test_a_host_refuses_an_empty_embed_before_sending_and_an_unknown_kind_by_name() -> None:
    host = _ScriptedHost(model_host_pb2.HostResponse())
    with pytest.raises(GantryError) as empty:
        await host.invoke("embed", wg.EmbedPayload(), trace_context={}, timeout_s=1.0)
    with pytest.raises(GantryError) as unknown:
        await host.invoke("ping", wg.EmbedPayload(), trace_context={}, timeout_s=1.0)
    assert (empty.value.reason, unknown.value.reason) == ("INVALID_PAYLOAD", "INVALID_PAYLOAD")
    assert "'ping'" in unknown.value.message
    assert host.sent == []


class _NoServer(ServerCalls):
    """A managed server's calls with no process behind them: only `invoke`'s refusals run."""

    _kind = SERVER_KINDS[LLAMA_CPP_SERVER]
    pid = 1
    deployment_id = "dep-llama"

    def _check_serving(self) -> None:
        raise AssertionError("a kind the server does not serve never reaches the server")

    def _crashed_error(self) -> GantryError | None:
        return None

    def rss_bytes(self) -> int:
        return 0


@pytest.mark.parametrize(
    "operation",
    [op for op in operations.OPERATIONS if op.kind != "generate"],
    ids=lambda op: op.rpc,
)
async def test_a_managed_server_answers_every_kind_it_does_not_serve_not_served_by_name(
    operation: operations.Operation,
) -> None:
    with pytest.raises(GantryError) as refused:
        await _NoServer().invoke(
            operation.kind, operation.payload_type(), trace_context={}, timeout_s=1.0
        )
    assert refused.value.reason == "INVALID_PAYLOAD"
    assert f"does not serve {operation.kind} " in refused.value.message
    assert refused.value.metadata["adapter"] == LLAMA_CPP_SERVER

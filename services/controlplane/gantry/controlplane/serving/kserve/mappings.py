"""Which tensors each kind of capability takes and gives, and how a call's tensors become the
gantry.v1.Inference request whose handler answers it (docs/kserve.md has the table).

A capability's kind follows from its bound deployment's adapter. The tensor names are the ones
Triton's Python backends usually use (`text_input` / `text_output` for generation, ...). Each
mapping builds the request of one Inference RPC and awaits that RPC's own handler, so the tenant,
the binding, the limits, the scheduler's admission, the tracing and the metrics are the ones every
gantry.v1 call gets. An input this kind does not take, a missing one, or one of the wrong type or
shape is INVALID_ARGUMENT naming the tensor.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import grpc

from gantry.common.errors import invalid_argument
from gantry.controlplane.evidence import adapter_modalities as adapters
from gantry.controlplane.serving.inference_service import InferenceService
from gantry.controlplane.serving.kserve.tensors import (
    BYTES,
    FLOAT_TYPES,
    FP32,
    INT32,
    INTEGER_TYPES,
    InputTensor,
    OutputTensor,
    bytes_output,
    fp32_output,
    fp32_values,
)
from gantry.v1 import common_pb2, inference_pb2

# An adopted server (AdoptEndpoint) answers Generate; its adapter name is the adoption's.
ADOPTED_ENDPOINT_ADAPTER = "adopted_openai_endpoint"
VARIABLE = -1
# The widths of the gantry.v1 fields the integer inputs fill (max_tokens, top_k: uint32).
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False


@dataclass(frozen=True, slots=True)
class Call:
    """One ModelInfer call as a mapping sees it."""

    capability: str
    tensors: Mapping[str, InputTensor]
    priority: common_pb2.Priority
    truncate: bool
    inference: InferenceService
    context: grpc.aio.ServicerContext


@dataclass(frozen=True, slots=True)
class Answer:
    outputs: list[OutputTensor]
    deployment_id: str
    node_id: str


@dataclass(frozen=True, slots=True)
class TensorMapping:
    kind: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    infer: Callable[[Call], Awaitable[Answer]]

    def check_names(self, tensors: Mapping[str, InputTensor]) -> None:
        taken = {spec.name for spec in self.inputs}
        for name in tensors:
            if name not in taken:
                article = "an" if self.kind[0] in "aeiou" else "a"
                raise invalid_argument(
                    f"{article} {self.kind} capability takes no input tensor {name!r}; it takes "
                    f"{', '.join(sorted(taken))}",
                    field=name,
                )


def _tensor(call: Call, name: str, *, required: bool = True) -> InputTensor | None:
    tensor = call.tensors.get(name)
    if tensor is None and required:
        raise invalid_argument(f"input tensor {name!r} is required", field=name)
    return tensor


def _bytes_list(call: Call, name: str, *, required: bool = True) -> list[bytes] | None:
    """A BYTES tensor of shape [N] or [N, 1], as its N elements."""
    tensor = _tensor(call, name, required=required)
    if tensor is None:
        return None
    if tensor.datatype != BYTES:
        raise invalid_argument(
            f"input tensor {name!r} must be BYTES, not {tensor.datatype}", field=name
        )
    if not (len(tensor.shape) == 1 or (len(tensor.shape) == 2 and tensor.shape[1] == 1)):
        raise invalid_argument(
            f"input tensor {name!r} must have shape [N] or [N, 1], not {list(tensor.shape)}",
            field=name,
        )
    return [value for value in tensor.values if isinstance(value, bytes)]


def _texts(call: Call, name: str, *, required: bool = True) -> list[str] | None:
    values = _bytes_list(call, name, required=required)
    if values is None:
        return None
    try:
        return [value.decode("utf-8") for value in values]
    except UnicodeDecodeError:
        raise invalid_argument(
            f"input tensor {name!r} holds an element that is not UTF-8 text", field=name
        ) from None


def _one_text(call: Call, name: str, *, required: bool = True) -> str | None:
    texts = _texts(call, name, required=required)
    if texts is None:
        return None
    if len(texts) != 1:
        raise invalid_argument(
            f"input tensor {name!r} must hold exactly one element, not {len(texts)}", field=name
        )
    return texts[0]


def _scalar(
    call: Call, name: str, kinds: frozenset[str], *, ceiling: float = math.inf
) -> int | float | None:
    tensor = _tensor(call, name, required=False)
    if tensor is None:
        return None
    if tensor.datatype not in kinds:
        raise invalid_argument(
            f"input tensor {name!r} must be one of {', '.join(sorted(kinds))}, not "
            f"{tensor.datatype}",
            field=name,
        )
    if len(tensor.values) != 1:
        raise invalid_argument(
            f"input tensor {name!r} must hold exactly one element, not {len(tensor.values)}",
            field=name,
        )
    value = tensor.values[0]
    if isinstance(value, bytes) or not math.isfinite(value) or value < 0:
        raise invalid_argument(f"input tensor {name!r} must be finite and >= 0", field=name)
    if value > ceiling:
        raise invalid_argument(f"input tensor {name!r} must be at most {ceiling}", field=name)
    return value


def _media_type(data: bytes, *, name: str, kinds: Mapping[bytes, str]) -> str:
    """The media type a blob's signature says (the protocol carries none)."""
    if data[:4] == b"RIFF":
        signature = data[8:12]
    else:
        signature = next((magic for magic in kinds if data.startswith(magic)), b"")
    media_type = kinds.get(signature)
    if media_type is None:
        raise invalid_argument(
            f"input tensor {name!r} holds bytes that are none of "
            f"{', '.join(sorted(set(kinds.values())))}",
            field=name,
        )
    return media_type


_IMAGE_SIGNATURES = {
    b"\x89PNG\r\n\x1a\n": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
    b"WEBP": "image/webp",
}
_AUDIO_SIGNATURES = {b"WAVE": "audio/wav", b"fLaC": "audio/flac"}


def _images(call: Call, name: str) -> list[common_pb2.Image]:
    blobs = _bytes_list(call, name) or []
    return [
        common_pb2.Image(
            data=blob, media_type=_media_type(blob, name=name, kinds=_IMAGE_SIGNATURES)
        )
        for blob in blobs
    ]


def _embedding_block(response: inference_pb2.EmbedResponse) -> OutputTensor:
    block = b"".join(vector.float32_le for vector in response.vectors)
    return fp32_output("embedding", block, (len(response.vectors), response.dim))


async def _embed_texts(call: Call, texts: list[str]) -> Answer:
    response = await call.inference.Embed(
        inference_pb2.EmbedRequest(
            capability=call.capability,
            inputs=texts,
            priority=call.priority,
            encoding=inference_pb2.VECTOR_ENCODING_FLOAT32_LE_BYTES,
            truncate=call.truncate,
        ),
        call.context,
    )
    return Answer([_embedding_block(response)], response.deployment_id, response.node_id)


async def _embedding(call: Call) -> Answer:
    return await _embed_texts(call, _texts(call, "text") or [])


async def _rerank(call: Call) -> Answer:
    query = _one_text(call, "query") or ""
    documents = _texts(call, "documents") or []
    response = await call.inference.Rerank(
        inference_pb2.RerankRequest(
            capability=call.capability,
            query=query,
            documents=documents,
            priority=call.priority,
            truncate=call.truncate,
        ),
        call.context,
    )
    scores = [0.0] * len(documents)
    for ranked in response.results:  # by score; the tensor keeps the documents' order
        scores[ranked.index] = ranked.score
    return Answer(
        [fp32_values("scores", scores, (len(scores),))], response.deployment_id, response.node_id
    )


FINISH_REASONS = {
    common_pb2.FINISH_REASON_STOP: b"stop",
    common_pb2.FINISH_REASON_LENGTH: b"length",
    common_pb2.FINISH_REASON_CANCELLED: b"cancelled",
}


def generation_request(call: Call) -> inference_pb2.GenerateRequest:
    """A generation call's tensors as the GenerateRequest that Generate and GenerateStream take."""
    prompt = _one_text(call, "text_input") or ""
    max_tokens = _scalar(call, "max_tokens", INTEGER_TYPES, ceiling=UINT32_MAX)
    temperature = _scalar(call, "temperature", FLOAT_TYPES)
    top_p = _scalar(call, "top_p", FLOAT_TYPES)
    top_k = _scalar(call, "top_k", INTEGER_TYPES, ceiling=UINT32_MAX)
    seed = _scalar(call, "seed", INTEGER_TYPES, ceiling=UINT64_MAX)
    return inference_pb2.GenerateRequest(
        capability=call.capability,
        prompt=prompt,
        max_tokens=int(max_tokens or 0),
        stop=_texts(call, "stop", required=False) or [],
        sampling=common_pb2.SamplingSettings(
            temperature=temperature or 0.0,
            top_p=top_p or 0.0,
            top_k=int(top_k or 0),
            seed=int(seed or 0),
        ),
        priority=call.priority,
    )


def generation_outputs(
    text: str, finish_reason: common_pb2.FinishReason | None
) -> list[OutputTensor]:
    """`text_output`, and `finish_reason` when the generation has ended (None: it goes on)."""
    outputs = [bytes_output("text_output", [text.encode()], (1,))]
    if finish_reason is not None:
        reason = FINISH_REASONS.get(finish_reason, b"")
        outputs.append(bytes_output("finish_reason", [reason], (1,)))
    return outputs


async def _generation(call: Call) -> Answer:
    response = await call.inference.Generate(generation_request(call), call.context)
    return Answer(
        generation_outputs(response.text, response.finish_reason),
        response.deployment_id,
        response.node_id,
    )


async def _transcription(call: Call) -> Answer:
    blobs = _bytes_list(call, "audio") or []
    if len(blobs) != 1:
        raise invalid_argument(
            f"input tensor 'audio' must hold exactly one clip, not {len(blobs)}", field="audio"
        )
    audio = common_pb2.Audio(
        data=blobs[0], media_type=_media_type(blobs[0], name="audio", kinds=_AUDIO_SIGNATURES)
    )
    response = await call.inference.Transcribe(
        inference_pb2.TranscribeRequest(
            capability=call.capability,
            audio=audio,
            language=_one_text(call, "language", required=False) or "",
            priority=call.priority,
        ),
        call.context,
    )
    return Answer(
        [bytes_output("text", [response.text.encode()], (1,))],
        response.deployment_id,
        response.node_id,
    )


async def _ocr(call: Call) -> Answer:
    response = await call.inference.RecognizeText(
        inference_pb2.RecognizeTextRequest(
            capability=call.capability, images=_images(call, "image"), priority=call.priority
        ),
        call.context,
    )
    texts = [text.encode() for text in response.texts]
    return Answer(
        [bytes_output("text", texts, (len(texts),))], response.deployment_id, response.node_id
    )


async def _image(call: Call) -> Answer:
    """SigLIP2: images embedded, or scored against labels; or texts embedded (same space)."""
    if "text" in call.tensors:
        if "image" in call.tensors or "labels" in call.tensors:
            raise invalid_argument(
                "input tensor 'text' is embedded alone: send it without 'image' and 'labels'",
                field="text",
            )
        return await _embed_texts(call, _texts(call, "text") or [])
    images = _images(call, "image")
    labels = _texts(call, "labels", required=False)
    if labels is None:
        embedded = await call.inference.EmbedImage(
            inference_pb2.EmbedImageRequest(
                capability=call.capability,
                images=images,
                priority=call.priority,
                encoding=inference_pb2.VECTOR_ENCODING_FLOAT32_LE_BYTES,
            ),
            call.context,
        )
        return Answer([_embedding_block(embedded)], embedded.deployment_id, embedded.node_id)
    classified = await call.inference.ClassifyImage(
        inference_pb2.ClassifyImageRequest(
            capability=call.capability, images=images, labels=labels, priority=call.priority
        ),
        call.context,
    )
    scores = [0.0] * (len(images) * len(labels))
    for row, result in enumerate(classified.results):  # by score; the tensor keeps label order
        for scored in result.labels:
            scores[row * len(labels) + scored.index] = scored.score
    return Answer(
        [fp32_values("scores", scores, (len(images), len(labels)))],
        classified.deployment_id,
        classified.node_id,
    )


def _spec(name: str, datatype: str, *shape: int, optional: bool = False) -> TensorSpec:
    return TensorSpec(name=name, datatype=datatype, shape=shape, optional=optional)


EMBEDDING = TensorMapping(
    kind="embedding",
    inputs=(_spec("text", BYTES, VARIABLE),),
    outputs=(_spec("embedding", FP32, VARIABLE, VARIABLE),),
    infer=_embedding,
)
RERANK = TensorMapping(
    kind="rerank",
    inputs=(_spec("query", BYTES, 1), _spec("documents", BYTES, VARIABLE)),
    outputs=(_spec("scores", FP32, VARIABLE),),
    infer=_rerank,
)
GENERATION = TensorMapping(
    kind="generation",
    inputs=(
        _spec("text_input", BYTES, 1),
        _spec("max_tokens", INT32, 1, optional=True),
        _spec("stop", BYTES, VARIABLE, optional=True),
        _spec("temperature", FP32, 1, optional=True),
        _spec("top_p", FP32, 1, optional=True),
        _spec("top_k", INT32, 1, optional=True),
        _spec("seed", "UINT64", 1, optional=True),
    ),
    outputs=(_spec("text_output", BYTES, 1), _spec("finish_reason", BYTES, 1)),
    infer=_generation,
)
TRANSCRIPTION = TensorMapping(
    kind="transcription",
    inputs=(_spec("audio", BYTES, 1), _spec("language", BYTES, 1, optional=True)),
    outputs=(_spec("text", BYTES, 1),),
    infer=_transcription,
)
OCR = TensorMapping(
    kind="ocr",
    inputs=(_spec("image", BYTES, VARIABLE),),
    outputs=(_spec("text", BYTES, VARIABLE),),
    infer=_ocr,
)
IMAGE = TensorMapping(
    kind="image",
    inputs=(
        _spec("image", BYTES, VARIABLE, optional=True),
        _spec("labels", BYTES, VARIABLE, optional=True),
        _spec("text", BYTES, VARIABLE, optional=True),
    ),
    outputs=(
        _spec("embedding", FP32, VARIABLE, VARIABLE),
        _spec("scores", FP32, VARIABLE, VARIABLE),
    ),
    infer=_image,
)

_BY_ADAPTER: Mapping[str, TensorMapping] = {
    adapters.DEFAULT_ADAPTER: EMBEDDING,
    "sentence_transformers_cross_encoder": RERANK,
    adapters.WHISPER_ADAPTER: TRANSCRIPTION,
    adapters.TROCR_ADAPTER: OCR,
    adapters.SIGLIP2_ADAPTER: IMAGE,
    ADOPTED_ENDPOINT_ADAPTER: GENERATION,
    **{name: GENERATION for name in adapters.GENERATION_ADAPTERS},
}
MAPPINGS: Sequence[TensorMapping] = (EMBEDDING, RERANK, GENERATION, TRANSCRIPTION, OCR, IMAGE)


def probed_width(kind: str, output_shape: Sequence[object]) -> int:
    """An embedding capability's vector width from its probe's output shape (`[1, dim]`: the
    probe embedded one text with the deployment's own profile); 0 when the shape does not state
    it, or the kind's outputs are not that one vector."""
    if kind != EMBEDDING.kind or len(output_shape) != 2:
        return 0
    width = output_shape[1]
    return width if isinstance(width, int) and width > 0 else 0


def stated_outputs(mapping: TensorMapping, width: int) -> tuple[TensorSpec, ...]:
    """The mapping's outputs with the embedding's width stated (`[-1, width]`) when known."""
    if not width:
        return mapping.outputs
    return tuple(
        TensorSpec(spec.name, spec.datatype, (*spec.shape[:-1], width), spec.optional)
        if spec.name == "embedding" and spec.shape == (VARIABLE, VARIABLE)
        else spec
        for spec in mapping.outputs
    )


def mapping_of(adapter: str) -> TensorMapping | None:
    """The tensor mapping of a deployment's adapter ("" is the default); None: it has none."""
    return _BY_ADAPTER.get(adapter or adapters.DEFAULT_ADAPTER)

"""Each client method as data (pure): the RPC it calls, the request it sends and how its answer
is shaped, shared by the blocking and the asyncio client.

The RPCs come from gantry.common.operations, the one declaration of the inference operations: a
method is named after its RPC in snake case (Embed -> embed, GenerateStream -> generate_stream),
and its path and message types are the operation's. A new operation is a method to add here
and on both clients; tests/unit/test_client_calls.py fails until each has it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypedDict, TypeVar

import numpy as np
import numpy.typing as npt
from google.protobuf.message import Message

from gantry.client.vectors import vectors_of
from gantry.common.operations import OPERATIONS, Operation
from gantry.v1 import common_pb2, inference_pb2

SERVICE = "gantry.v1.Inference"
T = TypeVar("T")


def snake_case(rpc: str) -> str:
    """`GenerateStream` -> `generate_stream`."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", rpc).lower()


@dataclass(frozen=True, slots=True)
class Rpc:
    """One Inference RPC as a client method: its name and path, and how its messages travel."""

    method: str  # the client's method, the RPC in snake case
    path: str  # /gantry.v1.Inference/Embed
    operation: Operation

    def multicallable(self, channel: Any) -> Any:
        """The callable that makes this RPC on `channel` (a grpc.Channel or grpc.aio.Channel:
        both make them the same way)."""
        make = channel.unary_stream if self.operation.streaming else channel.unary_unary
        return make(
            self.path,
            request_serializer=self.operation.request_type.SerializeToString,
            response_deserializer=self.operation.response_type.FromString,
        )


RPCS: Mapping[str, Rpc] = {
    snake_case(operation.rpc): Rpc(
        method=snake_case(operation.rpc), path=f"/{SERVICE}/{operation.rpc}", operation=operation
    )
    for operation in OPERATIONS
}


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """A method's call: the RPC, its request, and what the caller gets from each response (the
    one answer, or each chunk of a stream)."""

    rpc: Rpc
    request: Message
    shape: Callable[[Any], T]


@dataclass(frozen=True, slots=True)
class Ranked:
    """One document of a rerank: its position in the request, its text and its score."""

    index: int
    document: str
    score: float


ChatMessage = common_pb2.ChatMessage | Mapping[str, str]


def _unchanged(response: T) -> T:
    return response


def embed(
    capability: str, inputs: Sequence[str], *, truncate: bool
) -> Call[npt.NDArray[np.float32]]:
    request = inference_pb2.EmbedRequest(
        capability=capability,
        inputs=list(inputs),
        truncate=truncate,
        encoding=inference_pb2.VECTOR_ENCODING_FLOAT32_LE_BYTES,
    )
    return Call(RPCS["embed"], request, vectors_of)


def rerank(
    capability: str, query: str, documents: Sequence[str], *, top_n: int, truncate: bool
) -> Call[list[Ranked]]:
    documents = list(documents)
    request = inference_pb2.RerankRequest(
        capability=capability, query=query, documents=documents, top_n=top_n, truncate=truncate
    )

    def ranked(response: inference_pb2.RerankResponse) -> list[Ranked]:
        return [Ranked(r.index, documents[r.index], r.score) for r in response.results]

    return Call(RPCS["rerank"], request, ranked)


def _chat_message(message: ChatMessage) -> common_pb2.ChatMessage:
    if isinstance(message, common_pb2.ChatMessage):
        return message
    return common_pb2.ChatMessage(role=message["role"], content=message["content"])


class Generation(TypedDict, total=False):
    """How to generate, beside the prompt: `generate` and `generate_stream` take these as
    keyword arguments. Each left out keeps the proto's default (0: the profile's or greedy)."""

    messages: Sequence[ChatMessage]  # a chat instead of (or after) the prompt
    max_tokens: int  # at most the profile's max_new_tokens; 0: the profile's
    stop: Sequence[str]  # stop sequences, cut from the text
    temperature: float  # 0: greedy
    top_p: float
    top_k: int
    seed: int  # with temperature > 0: the same seed gives the same text


def generate_request(
    capability: str, prompt: str, options: Generation
) -> inference_pb2.GenerateRequest:
    """The request of a generation, answered whole (Generate) or streamed (GenerateStream). An
    option Generation does not name is refused (a misspelt one would be ignored otherwise)."""
    if unknown := sorted(set(options) - set(Generation.__annotations__)):
        raise TypeError(f"unknown generation option(s): {', '.join(unknown)}")
    return inference_pb2.GenerateRequest(
        capability=capability,
        prompt=prompt,
        messages=[_chat_message(message) for message in options.get("messages", ())],
        max_tokens=options.get("max_tokens", 0),
        stop=list(options.get("stop", ())),
        sampling=common_pb2.SamplingSettings(
            temperature=options.get("temperature", 0.0),
            top_p=options.get("top_p", 0.0),
            top_k=options.get("top_k", 0),
            seed=options.get("seed", 0),
        ),
    )


def generate(request: inference_pb2.GenerateRequest) -> Call[inference_pb2.GenerateResponse]:
    return Call(RPCS["generate"], request, _unchanged)


def generate_stream(request: inference_pb2.GenerateRequest) -> Call[inference_pb2.GenerateChunk]:
    return Call(RPCS["generate_stream"], request, _unchanged)


def transcribe(
    capability: str, audio: common_pb2.Audio, *, language: str, timestamps: bool
) -> Call[inference_pb2.TranscribeResponse]:
    request = inference_pb2.TranscribeRequest(
        capability=capability, audio=audio, language=language, timestamps=timestamps
    )
    return Call(RPCS["transcribe"], request, _unchanged)


def recognize_text(capability: str, images: Sequence[common_pb2.Image]) -> Call[list[str]]:
    request = inference_pb2.RecognizeTextRequest(capability=capability, images=list(images))
    return Call(
        RPCS["recognize_text"],
        request,
        lambda response: list(response.texts),
    )


def embed_image(
    capability: str, images: Sequence[common_pb2.Image]
) -> Call[npt.NDArray[np.float32]]:
    request = inference_pb2.EmbedImageRequest(
        capability=capability,
        images=list(images),
        encoding=inference_pb2.VECTOR_ENCODING_FLOAT32_LE_BYTES,
    )
    return Call(RPCS["embed_image"], request, vectors_of)


def classify_image(
    capability: str, images: Sequence[common_pb2.Image], labels: Sequence[str], *, top_k: int
) -> Call[list[inference_pb2.ImageClassification]]:
    request = inference_pb2.ClassifyImageRequest(
        capability=capability, images=list(images), labels=list(labels), top_k=top_k
    )
    return Call(RPCS["classify_image"], request, lambda response: list(response.results))

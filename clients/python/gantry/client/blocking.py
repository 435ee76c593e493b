"""`Client`: gantry.v1.Inference as blocking methods, one per RPC (see gantry.client.calls)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar, Unpack

import grpc
import numpy as np
import numpy.typing as npt

from gantry.client import calls
from gantry.client.calls import Call, Generation, Ranked
from gantry.client.connection import Connection
from gantry.client.errors import error_from_rpc
from gantry.v1 import common_pb2, inference_pb2

T = TypeVar("T")


class Client(Connection):
    """A blocking client of one or several Gantry control planes. Every method raises a
    gantry.client.GantryError subclass when the call fails; `timeout` is its deadline in seconds
    (default: the client's). Use as a context manager, or call close()."""

    _asynchronous = False

    def _unary(self, call: Call[T], timeout: float | None) -> T:
        try:
            response = self._start(call, timeout)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from error
        return call.shape(response)

    def _stream(self, call: Call[T], timeout: float | None) -> Iterator[T]:
        responses = self._start(call, timeout)
        try:
            for response in responses:
                yield call.shape(response)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from error
        finally:
            responses.cancel()  # a caller that stops reading ends the generation

    def embed(
        self,
        capability: str,
        inputs: Sequence[str],
        *,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> npt.NDArray[np.float32]:
        """The inputs' embeddings, one row each: an (n, dim) float32 array."""
        return self._unary(calls.embed(capability, inputs, truncate=truncate), timeout)

    def rerank(
        self,
        capability: str,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int = 0,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> list[Ranked]:
        """The documents by relevance to the query, best first (`top_n` of them; 0: all)."""
        call = calls.rerank(capability, query, documents, top_n=top_n, truncate=truncate)
        return self._unary(call, timeout)

    def generate(
        self,
        capability: str,
        prompt: str = "",
        *,
        timeout: float | None = None,
        **options: Unpack[Generation],
    ) -> inference_pb2.GenerateResponse:
        """The generated text, whole (`.text`, `.finish_reason`, token counts); `options` as
        gantry.client.calls.Generation: messages, max_tokens, stop, temperature, top_p, top_k,
        seed."""
        request = calls.generate_request(capability, prompt, options)
        return self._unary(calls.generate(request), timeout)

    def generate_stream(
        self,
        capability: str,
        prompt: str = "",
        *,
        timeout: float | None = None,
        **options: Unpack[Generation],
    ) -> Iterator[inference_pb2.GenerateChunk]:
        """The generation as it is produced: chunks of new text, the last with finish_reason.
        The call starts at the first next(); the deadline covers the whole stream."""
        request = calls.generate_request(capability, prompt, options)
        return self._stream(calls.generate_stream(request), timeout)

    def transcribe(
        self,
        capability: str,
        audio: common_pb2.Audio,
        *,
        language: str = "",
        timestamps: bool = False,
        timeout: float | None = None,
    ) -> inference_pb2.TranscribeResponse:
        """The clip's transcript (`.text`; `.segments` with timestamps)."""
        call = calls.transcribe(capability, audio, language=language, timestamps=timestamps)
        return self._unary(call, timeout)

    def recognize_text(
        self,
        capability: str,
        images: Sequence[common_pb2.Image],
        *,
        timeout: float | None = None,
    ) -> list[str]:
        """The line of text in each image, in order."""
        return self._unary(calls.recognize_text(capability, images), timeout)

    def embed_image(
        self,
        capability: str,
        images: Sequence[common_pb2.Image],
        *,
        timeout: float | None = None,
    ) -> npt.NDArray[np.float32]:
        """The images' embeddings, one row each: an (n, dim) float32 array."""
        return self._unary(calls.embed_image(capability, images), timeout)

    def classify_image(
        self,
        capability: str,
        images: Sequence[common_pb2.Image],
        labels: Sequence[str],
        *,
        top_k: int = 0,
        timeout: float | None = None,
    ) -> list[inference_pb2.ImageClassification]:
        """Each image's labels by score, highest first (`top_k` of them; 0: all)."""
        return self._unary(calls.classify_image(capability, images, labels, top_k=top_k), timeout)

    def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

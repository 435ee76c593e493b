"""What the worker asks a managed server, over loopback HTTP: generate (streamed or not), embed
where the kind serves it, a cheap ping (GET /v1/models), and a deep check (one real token). Every
other inference operation is answered "not served" by `invoke`, whatever it is.

Every call is bounded (`timeout_s`, and at most `max_pending` at once: QUEUE_FULL beyond). A
caller that is cancelled leaves its `async with` and httpx closes the connection, which is how
an OpenAI-compatible server learns to stop generating (llama.cpp's checks for the disconnect
between tokens). A stream is also left, and so closed, once it passes the call's max_tokens
(`StreamAccumulator`): it ends as a LENGTH finish, whatever the server does. Errors are mapped
once: a transport's in `_failure`, a server's refusal (its status and words) in `_server_failed`,
which an adopted server (`adopted_endpoint.py`) overrides so its words never reach a client.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Unpack, cast

import httpx
from google.protobuf.message import Message

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2, model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.managed_server.kinds import ServerKind
from gantry.worker.managed_server.openai_protocol import (
    EMBEDDINGS,
    MODELS,
    RELAY_CHARS_PER_TOKEN,
    ServerFailed,
    SseDecoder,
    StreamAccumulator,
    completion_request,
    generate_result,
    server_words,
)
from gantry.worker.model_host.environments import OFFLINE_ENVIRONMENT
from gantry.worker.model_host.host_calls import InvokeOptions
from gantry.worker.model_host.proc_facts import peak_rss_bytes_of, rss_bytes_of

logger = logging.getLogger("gantry.worker.managed_server")

OK = wg.HEALTH_STATUS_OK
FAILED = wg.HEALTH_STATUS_FAILED
NOT_CHECKED = wg.HEALTH_STATUS_NOT_CHECKED
# The deep check's prompt: one greedy token of it proves the model runs.
HEALTH_PROBE_PROMPT = "Hello"
NO_CUDA_READINGS = "a managed server reports no CUDA allocator readings"


class ServerCalls(abc.ABC):
    """The calls of a running managed server; `ManagedServer` supplies the process side."""

    _client: httpx.AsyncClient
    _kind: ServerKind
    _served_name: str
    _max_new_tokens: int
    _max_pending: int
    _in_flight: int

    @property
    @abc.abstractmethod
    def pid(self) -> int: ...

    @property
    @abc.abstractmethod
    def deployment_id(self) -> str: ...

    @abc.abstractmethod
    def _check_serving(self) -> None:
        """Raise the reason this server cannot take a call now (stopping, crashed, hung)."""

    @abc.abstractmethod
    def _crashed_error(self) -> GantryError | None:
        """RUNTIME_CRASHED with the output tail once the process is gone; None while it runs."""

    @abc.abstractmethod
    def rss_bytes(self) -> int: ...

    # -- generation ----------------------------------------------------------------------------

    async def generate(
        self,
        payload: wg.GeneratePayload,
        *,
        trace_context: dict[str, str],
        timeout_s: float,
        on_delta: Callable[[wg.GenerateDelta], None] | None = None,
    ) -> wg.GenerateResult:
        request = completion_request(
            payload,
            model=self._served_name,
            max_new_tokens=self._max_new_tokens,
            top_k_off=self._kind.top_k_off,
            neutral_sampling=self._kind.neutral_sampling,
        )
        max_tokens = int(request.body["max_tokens"])
        async with self._call("generate", timeout_s):
            if not payload.stream:
                answer = await self._post_json(request.path, request.body)
                return _bounded(generate_result(answer, chat=request.chat), max_tokens)
            accumulated = StreamAccumulator(chat=request.chat, max_tokens=max_tokens)
            decoder = SseDecoder()
            # Leaving this block closes the response, and with it the connection when the
            # stream is not over: how a server cut at max_tokens is told to stop.
            async with self._client.stream("POST", request.path, json=request.body) as response:
                if response.status_code != 200:
                    raise ServerFailed(response.status_code, server_words(await _head(response)))
                async for chunk in response.aiter_bytes():
                    for data in decoder.feed(chunk):
                        delta = accumulated.event(data)
                        if delta is not None and on_delta is not None:
                            _deliver(on_delta, delta, self.deployment_id)
                    if accumulated.done:
                        break
            if accumulated.cut:
                logger.warning(
                    "the server of %s streamed past max_tokens %d; cut and closed",
                    self.deployment_id,
                    max_tokens,
                )
            result = accumulated.result()
            if result.finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED:
                raise GantryError(
                    "INVOKE_FAILED",
                    f"the server ended its stream after {result.completion_tokens} tokens "
                    "without a finish reason (llama.cpp's server does so when another request "
                    "arrives while it streams, unless started with --interrupt_requests false)",
                    deployment_id=self.deployment_id,
                )
            if not result.prompt_tokens:
                result.prompt_tokens = await self._prompt_tokens(request.path, request.body)
            return result

    async def _prompt_tokens(self, path: str, streamed_body: dict[str, Any]) -> int:
        """The prompt's token count as the server itself counts it, for a server whose stream
        carries no usage (llama.cpp's): the same request once more, whole and one token long.
        The server reuses the prompt it just evaluated, so this costs one decoding step."""
        body = {**streamed_body, "stream": False, "max_tokens": 1}
        body.pop("stream_options", None)
        answer = await self._post_json(path, body)
        usage = answer.get("usage")
        prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if not isinstance(prompt_tokens, int) or prompt_tokens <= 0:
            raise GantryError(
                "INVOKE_FAILED", "the server reports no prompt token count for this request"
            )
        return prompt_tokens

    async def embed(
        self,
        inputs: list[str],
        *,
        trace_context: dict[str, str],
        timeout_s: float,
        truncate: bool = False,
    ) -> wg.EmbedResult:
        if not self._kind.serves_embeddings:
            raise self._not_served("embed")
        async with self._call("embed", timeout_s):
            answer = await self._post_json(
                EMBEDDINGS, {"model": self._served_name, "input": list(inputs)}
            )
        return _embed_result(answer)

    async def invoke(
        self, kind: str, payload: Message, **options: Unpack[InvokeOptions]
    ) -> Message:
        """One inference operation's payload (`kind`, gantry.common.operations) answered by the
        server: a generation always, an embed where the kind serves /v1/embeddings; any other
        kind is INVALID_PAYLOAD naming it and the server kind (the client's error)."""
        if kind == "generate":
            return await self.generate(
                cast(wg.GeneratePayload, payload),
                trace_context=dict(options["trace_context"]),
                timeout_s=options["timeout_s"],
                on_delta=options.get("on_delta"),
            )
        if kind == "embed":
            embed = cast(wg.EmbedPayload, payload)
            return await self.embed(
                list(embed.inputs),
                trace_context=dict(options["trace_context"]),
                timeout_s=options["timeout_s"],
                truncate=embed.truncate,
            )
        raise self._not_served(kind)

    # -- liveness and health -------------------------------------------------------------------

    @property
    def answered_by_its_calls(self) -> bool:
        """Whether a liveness ping now is answered by the calls in flight, not asked of the
        server. llama.cpp's server serves one request at a time, /v1/models included: asked
        during a generation, the ping waits behind it (a generation longer than the ping's
        deadline got the server killed as hung), or, where the server interrupts requests (its
        default), cuts the stream short. Each call in flight has its own deadline, so a server
        that hangs with calls in flight is found once they expire, at the next ping."""
        return self._in_flight > 0

    async def ping(self, *, timeout_s: float) -> model_host_pb2.Pong:
        """GET /v1/models answered within `timeout_s` (DEADLINE_EXCEEDED otherwise, which
        supervision treats as hung); answered by its calls while any is in flight."""
        if self.answered_by_its_calls:
            return model_host_pb2.Pong(rss_bytes=self.rss_bytes())
        async with self._call("ping", timeout_s, bounded=False):
            response = await self._client.get(MODELS)
            if response.status_code != 200:
                raise ServerFailed(response.status_code, server_words(response.content))
        return model_host_pb2.Pong(rss_bytes=self.rss_bytes())

    async def one_token(self, *, timeout_s: float) -> tuple[wg.GenerateResult, float]:
        """One greedy token of the probe prompt, and how long it took."""
        started = time.monotonic()
        result = await self.generate(
            wg.GeneratePayload(prompt=HEALTH_PROBE_PROMPT, max_tokens=1),
            trace_context={},
            timeout_s=timeout_s,
        )
        return result, time.monotonic() - started

    async def check_model(self, *, timeout_s: float) -> wg.HealthReport:
        started = time.monotonic()
        result, seconds = await self.one_token(timeout_s=timeout_s)
        model = _token_verdict(result, seconds)
        report = wg.HealthReport(
            process=wg.HealthLayer(status=OK, detail=f"pid {self.pid} alive"),
            runtime=wg.HealthLayer(status=OK, detail="the server answered a completion"),
            model=wg.HealthLayer(status=model[0], detail=model[1]),
            latency_seconds=time.monotonic() - started,
        )
        report.checked_at.GetCurrentTime()
        return report

    async def probe_check(self, *, timeout_s: float) -> model_host_pb2.ProbeResult:
        """A probe's evidence: one real token, the process's memory as /proc reads it."""
        try:
            result, seconds = await self.one_token(timeout_s=timeout_s)
        except GantryError as error:
            if error.reason in ("DEADLINE_EXCEEDED", "INVOKE_FAILED", "INVALID_PAYLOAD"):
                raise GantryError(
                    "HEALTH_FAILED", f"the probe completion failed: {error.message}"
                ) from error
            raise
        model = _token_verdict(result, seconds)
        health = wg.HealthReport(
            process=wg.HealthLayer(status=OK, detail=f"pid {self.pid} alive"),
            runtime=wg.HealthLayer(status=OK, detail="the server answered a completion"),
            model=wg.HealthLayer(status=model[0], detail=model[1]),
            latency_seconds=seconds,
        )
        health.checked_at.GetCurrentTime()
        return model_host_pb2.ProbeResult(
            health=health,
            output_shape=[1, result.completion_tokens],
            # A completion has no logits to test: a token that came back is the finite output.
            output_finite=model[0] == OK,
            first_invoke_seconds=seconds,
            memory=self._memory(),
            offline=wg.OfflineEvidence(
                local_files_only=True,  # the argv names the verified copy, never a hub id
                trust_remote_code=False,
                offline_env=offline_env_of(self.pid),
                isolation="NONE",
                isolation_reason=ISOLATION_REASON,
                network_guard=False,
            ),
        )

    def _memory(self) -> wg.MemoryEvidence:
        source = f"/proc/{self.pid}/status"
        memory = wg.MemoryEvidence()
        for field, reading, name in (
            ("rss_current", rss_bytes_of(self.pid), "VmRSS"),
            ("rss_peak", peak_rss_bytes_of(self.pid), "VmHWM"),
        ):
            measurement = getattr(memory, field)
            if reading is None:
                measurement.unavailable = f"{source} was unreadable"
            else:
                measurement.bytes = reading
            measurement.source = f"{source} {name}"
        for field in (
            "cuda_allocated_before_load",
            "cuda_allocated_after_load",
            "cuda_reserved_after_load",
            "cuda_peak_allocated",
        ):
            getattr(memory, field).unavailable = NO_CUDA_READINGS
        return memory

    # -- internals -----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _call(
        self, what: str, timeout_s: float, *, bounded: bool = True
    ) -> AsyncIterator[None]:
        self._check_serving()
        if bounded and self._in_flight >= self._max_pending:
            raise GantryError(
                "QUEUE_FULL",
                f"managed server {self.deployment_id!r} already has {self._in_flight} calls "
                "pending",
                deployment_id=self.deployment_id,
            )
        self._in_flight += bounded
        try:
            async with _deadline(what, timeout_s, self.deployment_id):
                yield
        except httpx.HTTPError as exc:
            raise self._failure(what, exc) from exc
        except ServerFailed as failed:
            raise self._server_failed(what, failed) from None
        finally:
            self._in_flight -= bounded

    async def _post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self._client.post(path, json=body)
        if response.status_code != 200:
            raise ServerFailed(response.status_code, server_words(response.content))
        try:
            answer = response.json()
        except ValueError:
            answer = None  # not JSON (or not UTF-8): refused as no object, below
        if not isinstance(answer, dict):
            raise GantryError("INVOKE_FAILED", f"the server answered {path} with no object")
        return answer

    def _server_failed(self, what: str, failed: ServerFailed) -> GantryError:
        """The caller's error for a server that refused `what` (or failed it mid-stream). A
        managed server is Gantry's own child, run from a verified copy: its words (a prompt past
        the context, ...) are the client's to read. A 4xx is about the request: the client's."""
        reason = "INVALID_PAYLOAD" if 400 <= failed.status < 500 else "INVOKE_FAILED"
        if not failed.status:
            return GantryError(reason, f"the server failed the generation: {failed.said}")
        return GantryError(
            reason, f"the server refused the call: HTTP {failed.status}: {failed.said}"
        )

    def _failure(self, what: str, exc: httpx.HTTPError) -> GantryError:
        crashed = self._crashed_error()
        if crashed is not None:
            return crashed
        return GantryError(
            "INVOKE_FAILED",
            f"managed server {self.deployment_id!r} failed {what}: {type(exc).__name__}: {exc}",
            deployment_id=self.deployment_id,
        )

    def _not_served(self, what: str) -> GantryError:
        return GantryError(
            "INVALID_PAYLOAD",
            f"a {self._kind.name} deployment does not serve {what} "
            f"(deployment {self.deployment_id!r})",
            adapter=self._kind.name,
            deployment_id=self.deployment_id,
        )


ISOLATION_REASON = (
    "a managed server runs outside the model host's sandbox: it is bound to 127.0.0.1 (checked "
    "from /proc after it answered), runs with the allow-listed offline environment and is given "
    "only the verified copy's path"
)


@contextlib.asynccontextmanager
async def _deadline(what: str, timeout_s: float, deployment_id: str) -> AsyncIterator[None]:
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except TimeoutError as exc:
        raise GantryError(
            "DEADLINE_EXCEEDED",
            f"managed server {deployment_id!r} did not answer {what} within {timeout_s:g}s",
            deployment_id=deployment_id,
        ) from exc


async def _head(response: httpx.Response) -> bytes:
    """The start of a refusal's body, read no further: its words are cut short anyway, and a
    server answering an error without end must not hold the call until its deadline."""
    head = b""
    async for chunk in response.aiter_bytes():
        head += chunk
        if len(head) >= _REFUSAL_HEAD_BYTES:
            break
    return head[:_REFUSAL_HEAD_BYTES]


# Enough of a refusal's body for its JSON's message (SERVER_TEXT_CHARS) in any encoding.
_REFUSAL_HEAD_BYTES = 16 * 1024


def _bounded(result: wg.GenerateResult, max_tokens: int) -> wg.GenerateResult:
    """A whole answer's text within what `max_tokens` allows relaying (as a stream is cut), so
    the control plane never reads it as a worker's protocol fault."""
    limit = max_tokens * RELAY_CHARS_PER_TOKEN
    if len(result.text) > limit:
        raise GantryError(
            "INVOKE_FAILED",
            f"the server answered {len(result.text)} characters for {max_tokens} tokens "
            f"(at most {limit} are relayed)",
        )
    return result


def _deliver(
    on_delta: Callable[[wg.GenerateDelta], None], delta: wg.GenerateDelta, deployment_id: str
) -> None:
    try:
        on_delta(delta)
    except Exception:
        # The caller's own fault: it must not end the generation it asked for.
        logger.exception("a generation delta of %s was not taken", deployment_id)


def offline_env_of(pid: int) -> dict[str, str]:
    """The offline flags as the server process `pid` was started with (/proc/<pid>/environ: the
    worker started it, as the same user), not as the worker meant to set them."""
    source = f"/proc/{pid}/environ"
    try:
        environ = Path(source).read_bytes()
    except OSError as exc:
        return offline_env_seen(None, unreadable=f"{source}: {exc.strerror or exc}")
    return offline_env_seen(environ, unreadable="")


def offline_env_seen(environ: bytes | None, *, unreadable: str) -> dict[str, str]:
    """Each offline flag `OFFLINE_ENVIRONMENT` names, read from a NUL-separated environment
    block: its value, "unset" when the block lacks it, or "unavailable: why" for every flag when
    the block could not be read (`environ` None). Pure."""
    if environ is None:
        return {name: f"unavailable: {unreadable}" for name in sorted(OFFLINE_ENVIRONMENT)}
    seen: dict[str, str] = {}
    for entry in environ.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            seen[name.decode(errors="replace")] = value.decode(errors="replace")
    return {name: seen.get(name, "unset") for name in sorted(OFFLINE_ENVIRONMENT)}


def _token_verdict(result: wg.GenerateResult, seconds: float) -> tuple[wg.HealthStatus, str]:
    if result.completion_tokens >= 1 or result.text:
        return OK, (
            f"one greedy token ({result.text!r}) in {seconds:.3f}s, finish "
            f"{common_pb2.FinishReason.Name(result.finish_reason)}"
        )
    return FAILED, "the server answered a one-token completion with no token"


def _embed_result(answer: dict[str, Any]) -> wg.EmbedResult:
    data = answer.get("data")
    if not isinstance(data, list):
        raise GantryError("INVOKE_FAILED", "the server's embeddings answer has no data")
    try:
        rows: list[Sequence[float]] = [
            item["embedding"] for item in sorted(data, key=lambda item: item.get("index", 0))
        ]
        dim = len(rows[0]) if rows else 0
        if any(len(row) != dim for row in rows):
            raise GantryError("INVOKE_FAILED", "the server's embeddings differ in width")
        packed = b"".join(struct.pack(f"<{dim}f", *row) for row in rows)
    except (KeyError, TypeError, AttributeError, struct.error):
        # Not OpenAI's shape (an item without `embedding`, a vector of non-numbers): typed,
        # never a traceback, and naming nothing the server sent.
        raise GantryError("INVOKE_FAILED", "the server's embeddings are malformed") from None
    return wg.EmbedResult(count=len(rows), dim=dim, float32_le=packed)

"""An adopted endpoint: an OpenAI-compatible server that runs outside Gantry, held as a resident
so the worker routes to it and health-checks it, and nothing more.

Invariants:
- No process is in Gantry's custody: pid 0, never started, stopped, signalled or restarted. A
  ping that fails or times out marks its health FAILED (RUNTIME_UNRESPONSIVE, never the
  DEADLINE_EXCEEDED that makes supervision kill a hung host); an unload only closes the client.
- Only a LOAD job that names it (LoadSpec.endpoint, from AdoptEndpoint) makes one: the worker
  never scans for servers or adopts one on its own.
- Its credential lives only in the HTTP client's Authorization header: never logged, never in
  inventory or evidence.
- Its words never reach a client: a refusal, an error event or a broken connection is answered
  with a fixed message naming the HTTP status (or the failure's kind), and what the server said
  goes, cut short, only to this worker's log (`_server_failed`, `_failure`). The server is not
  Gantry's: its text may carry its paths, other callers' prompts, its stack traces.
- A server that answers as a Gantry control plane (its GET /v1/models lists models with
  Gantry's own `gantry` member) is never adopted or kept: calling it would route the call back
  through Gantry to itself.

The calls themselves (completions and chat with SSE streaming, embeddings, the one-token deep
check) are the managed server's (`managed_server.server_calls.ServerCalls`), reused as they are.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import httpx

from gantry.common.digests import adapter_digest
from gantry.common.errors import GantryError
from gantry.v1 import common_pb2, model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.managed_server.kinds import ServerCommand, ServerInputs, ServerKind
from gantry.worker.managed_server.openai_protocol import MODELS, ServerFailed
from gantry.worker.managed_server.server_calls import OK, ServerCalls
from gantry.worker.residents import ResidentFacts

log = logging.getLogger(__name__)

ADOPTED_KIND_NAME = "adopted_openai_endpoint"
ISOLATION_REASON = (
    "an adopted server runs outside Gantry's custody: Gantry neither started nor sandboxes it"
)
BYTES_UNAVAILABLE = (
    "UNAVAILABLE: an adopted server's weights are not in Gantry's custody, so no byte of them "
    "was verified against a manifest"
)
MEMORY_UNAVAILABLE = (
    "UNAVAILABLE: an adopted server is not a process of this worker, so its memory is not read"
)
_CONNECT_TIMEOUT_S = 5.0
# What of a transport error's text the log keeps (it may quote the server's bytes).
_LOGGED_CHARS = 300


def _never_launched(inputs: ServerInputs) -> ServerCommand:
    raise GantryError("RUNTIME_INCOMPATIBLE", "an adopted endpoint is never launched by Gantry")


# Whether the server offers /v1/embeddings is the server's to say: a 404 comes back as the
# client's INVALID_PAYLOAD (server_calls maps every 4xx that way).
ADOPTED_KIND = ServerKind(
    name=ADOPTED_KIND_NAME, serves_embeddings=True, top_k_off=0, command=_never_launched
)


class AdoptedEndpoint(ServerCalls):
    def __init__(
        self,
        *,
        deployment_id: str,
        endpoint: wg.EndpointSpec,
        adapter: common_pb2.AdapterSettings,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {endpoint.credential}"} if endpoint.credential else {}
        self._client = httpx.AsyncClient(
            base_url=endpoint.url,
            headers=headers,
            # Per call bounds come from each caller's timeout_s (ServerCalls._call).
            timeout=httpx.Timeout(None, connect=_CONNECT_TIMEOUT_S),
            trust_env=False,  # no proxy from the environment: the URL is the node's own
            transport=transport,
        )
        self._kind = ADOPTED_KIND
        self._served_name = endpoint.model
        self._max_new_tokens = adapter.max_new_tokens
        # The scheduler sends at most max_concurrency at once; the bound only catches a bug.
        self._max_pending = max(1, adapter.max_concurrency) * 4
        self._in_flight = 0
        self._deployment_id = deployment_id
        self.url = endpoint.url
        self.model = endpoint.model
        self._forgotten = False
        self._ready = model_host_pb2.HostReady(
            pid=0, isolation="NONE", isolation_reason=ISOLATION_REASON
        )

    # -- what supervision reads --------------------------------------------------------------

    @property
    def pid(self) -> int:
        return 0  # no process in Gantry's custody

    @property
    def deployment_id(self) -> str:
        return self._deployment_id

    @property
    def alive(self) -> bool:
        return not self._forgotten

    @property
    def returncode(self) -> int | None:
        return None

    @property
    def unresponsive(self) -> GantryError | None:
        return None

    @property
    def ready(self) -> model_host_pb2.HostReady:
        return self._ready

    def rss_bytes(self) -> int:
        return 0  # not measured (MEMORY_UNAVAILABLE says why); never a reading of ours

    def kill_unresponsive(self, why: str) -> None:
        # Never signalled: it is not ours. Supervision only calls this on DEADLINE_EXCEEDED,
        # which `ping` never raises; this stays a no-op in case that ever changes.
        log.warning("adopted endpoint of %s is unresponsive (%s); left running", self.url, why)

    def _check_serving(self) -> None:
        if self._forgotten:
            raise GantryError(
                "DEPLOYMENT_NOT_READY",
                f"the adopted endpoint of {self._deployment_id} was unloaded",
                deployment_id=self._deployment_id,
            )

    def _crashed_error(self) -> GantryError | None:
        return None  # there is no process of ours to have crashed

    def _server_failed(self, what: str, failed: ServerFailed) -> GantryError:
        """A fixed message naming the status; the server's own words go to this log only."""
        reason = "INVALID_PAYLOAD" if 400 <= failed.status < 500 else "INVOKE_FAILED"
        answered = f"HTTP {failed.status}" if failed.status else "an error event mid-stream"
        log.warning(
            "adopted endpoint %s of %s answered %s with %s: %r",
            self.url,
            self._deployment_id,
            what,
            answered,
            failed.said,  # already cut to SERVER_TEXT_CHARS; %r keeps it on one line
        )
        return GantryError(
            reason,
            f"the adopted server answered {what} with {answered} (its message is in the "
            "worker's log)",
            deployment_id=self._deployment_id,
            **({"upstream_status": str(failed.status)} if failed.status else {}),
        )

    def _failure(self, what: str, exc: httpx.HTTPError) -> GantryError:
        """The transport's error by its kind only: an HTTP parser's message quotes the bytes the
        server sent (a bad status line, a header), which are the server's words too."""
        log.warning(
            "adopted endpoint %s of %s failed %s: %r",
            self.url,
            self._deployment_id,
            what,
            str(exc)[:_LOGGED_CHARS],
        )
        return GantryError(
            "INVOKE_FAILED",
            f"the adopted server failed {what}: {type(exc).__name__}",
            deployment_id=self._deployment_id,
        )

    # -- liveness and health ------------------------------------------------------------------

    async def ping(self, *, timeout_s: float) -> model_host_pb2.Pong:
        """GET /v1/models lists the model. A miss is RUNTIME_UNRESPONSIVE (or the server's own
        refusal), so supervision marks the runtime layer FAILED and never kills anything. Not
        asked while calls are in flight (`answered_by_its_calls`)."""
        if self.answered_by_its_calls:
            return model_host_pb2.Pong(rss_bytes=0)
        try:
            async with self._call("ping", timeout_s, bounded=False):
                response = await self._client.get(MODELS)
        except GantryError as error:
            if error.reason == "DEADLINE_EXCEEDED":
                raise GantryError(
                    "RUNTIME_UNRESPONSIVE",
                    f"adopted endpoint {self.url} did not answer GET {MODELS} within "
                    f"{timeout_s:g}s",
                    deployment_id=self._deployment_id,
                ) from None
            raise
        if response.status_code != 200:
            raise GantryError(
                "RUNTIME_UNRESPONSIVE",
                f"adopted endpoint {self.url} answered GET {MODELS} with HTTP "
                f"{response.status_code}",
                deployment_id=self._deployment_id,
            )
        if _answers_as_gantry(response):
            raise GantryError(
                "RUNTIME_UNRESPONSIVE",
                f"adopted endpoint {self.url} answers as a Gantry control plane (its {MODELS} "
                "names Gantry deployments): Gantry does not route calls back to itself",
                deployment_id=self._deployment_id,
            )
        listed = _model_ids(response)
        if self.model not in listed:
            raise GantryError(
                "RUNTIME_UNRESPONSIVE",
                f"adopted endpoint {self.url} does not list model {self.model!r} "
                f"(it lists {sorted(listed)[:8]})",
                deployment_id=self._deployment_id,
            )
        return model_host_pb2.Pong(rss_bytes=0)

    async def check_model(self, *, timeout_s: float) -> wg.HealthReport:
        report = await super().check_model(timeout_s=timeout_s)
        report.process.CopyFrom(
            wg.HealthLayer(status=OK, detail="adopted: no process in Gantry's custody")
        )
        return report

    async def stop(self, *, grace_s: float = 0.0) -> wg.UnloadEvidence:
        """Forget it: close the client. Nothing is sent to the server, which keeps running.
        `process_exited` says custody is over (there was never a process of ours)."""
        self._forgotten = True
        await self._client.aclose()
        return wg.UnloadEvidence(pid=0, process_exited=True)

    async def terminate(self, *, grace_s: float, reap_s: float = 0.0) -> wg.UnloadEvidence:
        """The worker is stopping: forgotten as by `stop`; the server was never ours to signal."""
        return await self.stop(grace_s=grace_s)


def _listed(response: httpx.Response) -> list[dict[str, object]]:
    try:
        data = response.json().get("data", [])
    except (ValueError, AttributeError):
        return []
    return [item for item in data if isinstance(item, dict)] if isinstance(data, list) else []


def _model_ids(response: httpx.Response) -> set[str]:
    return {str(item.get("id")) for item in _listed(response)}


def _answers_as_gantry(response: httpx.Response) -> bool:
    """Whether a model list is a Gantry HTTP door's: each of its models carries a `gantry`
    object naming the deployment behind it (serving/openai_http/responses.py `model_body`)."""
    for item in _listed(response):
        marker = item.get("gantry")
        if isinstance(marker, dict) and "deployment_id" in marker:
            return True
    return False


def adopted_facts(spec: wg.LoadSpec) -> ResidentFacts:
    """What exact adoption after a control-plane restart compares: no artifact, no environment
    of ours; the adapter settings the control plane recorded."""
    return ResidentFacts(
        artifact_digest="",
        environment_id="",
        adapter_digest=adapter_digest(spec.adapter),
        environment_fingerprint="",
    )


async def adopt_endpoint(
    spec: wg.LoadSpec,
    *,
    admit: Callable[[str, ResidentFacts, AdoptedEndpoint], object],
    check_timeout_s: float,
    transport: httpx.AsyncBaseTransport | None = None,  # tests: an in-memory server
) -> wg.LoadEvidence:
    """Check the server answers and lists the model, then hand it to supervision (`admit`).
    LOAD_FAILED (class INFRA) when it does not: nothing is kept."""
    started = time.monotonic()
    endpoint = AdoptedEndpoint(
        deployment_id=spec.deployment_id,
        endpoint=spec.endpoint,
        adapter=spec.adapter,
        transport=transport,
    )
    try:
        await endpoint.ping(timeout_s=check_timeout_s)
    except GantryError as error:
        await endpoint.stop()
        raise GantryError(
            "LOAD_FAILED",
            f"the adopted endpoint of {spec.deployment_id} is not serving: {error.message}",
            deployment_id=spec.deployment_id,
        ) from None
    except BaseException:
        await endpoint.stop()
        raise
    facts = adopted_facts(spec)
    admit(spec.deployment_id, facts, endpoint)
    return wg.LoadEvidence(
        pid=0,
        load_seconds=time.monotonic() - started,
        adapter_digest=facts.adapter_digest,
        environment_fingerprint="",
        isolation="NONE",
        isolation_reason=ISOLATION_REASON,
        bytes_unavailable=BYTES_UNAVAILABLE,
        memory_unavailable=MEMORY_UNAVAILABLE,
    )

"""Issue 26's acceptance end to end: tenants' shares and a tenant's queue depth via `gantry up`.

A script, not a test (it runs `gantry up --device cpu` with the bundled model for a minute or
two). Two measurements, each against a fresh `gantry up` in a temporary state directory:

- shares (default): tenants `light` (weight 1) and `heavy` (weight 3), each with its own client
  key, saturate the bundled deployment from CALLERS concurrent callers each, every call an Embed
  of 8 sentences, for SECONDS after a warm-up; it prints each tenant's served calls and the
  heavy : light ratio (the issue's bound: within 10% of 3, i.e. >= 2.70).
- `--abandoned`: tenant `heavy` sends four legal maximum-size Embeds (1,024 inputs of ~8,000
  characters, truncated) with 10 s deadlines and gives up at 10 s; tenant `light` sends a
  one-sentence Embed 0.5 s after them. It prints when light's answer came, from its send and from
  the abandonment (the issue's bound: within 5 s of it).
- `--queue-depth`: tenant `bounded` with max_queue_depth 2 sends 40 Embeds of 8 sentences at
  once; it prints how many were served and how many refused, by ErrorInfo reason. The bundled
  deployment's 32 slots are 32 inputs: 4 calls run, 2 wait, 34 are refused QUEUE_FULL.

    .venv/bin/python -m tests.bench.tenant_shares [--seconds 30] [--callers 24]
    .venv/bin/python -m tests.bench.tenant_shares --queue-depth
    .venv/bin/python -m tests.bench.tenant_shares --abandoned

A busy machine moves the figures: say how busy it was when quoting them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from gantry.cli.connection import Metadata, bearer
from gantry.cli.errors import error_reason
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc, inference_pb2
from tests.bench.served import CAPABILITY, Served, gantry_up, queue_snapshot
from tests.waiting import poll

SENTENCES = [
    f"Sentence {i} of the tenant shares bench: a model host batches the texts it holds, "
    f"and the scheduler decides whose texts those are."
    for i in range(8)
]
WEIGHTS = {"light": 1, "heavy": 3}
WARM_UP_S = 5.0
FLOOD = 40
CALL_TIMEOUT_S = 60.0


def say(line: str) -> None:
    print(line, flush=True)


async def _tenant_key(served: Served, policy: common_pb2.TenantPolicy) -> Metadata:
    """Set the tenant's policy and mint a client key of its own (the operator API, as
    `gantry tenants set` and `gantry keys create` do); the key's metadata."""
    token = (served.log.parent / "state" / "operator.token").read_text(encoding="utf-8")
    operator = bearer(token.strip())
    stub = control_plane_pb2_grpc.ControlPlaneStub(served.channel)
    request = control_plane_pb2.SetTenantPolicyRequest(policy=policy)
    await stub.SetTenantPolicy(request, metadata=operator)
    created = await stub.CreateApiKey(
        control_plane_pb2.CreateApiKeyRequest(tenant_id=policy.tenant_id, name="tenant-shares"),
        metadata=operator,
    )
    return bearer(created.api_key)


def _embed(served: Served, md: Metadata) -> Callable[[], Awaitable[object]]:
    request = inference_pb2.EmbedRequest(capability=CAPABILITY, inputs=SENTENCES)
    return lambda: served.inference.Embed(request, metadata=md, timeout=CALL_TIMEOUT_S)


async def shares(served: Served, *, seconds: float, callers: int) -> int:
    keys = {
        tenant: await _tenant_key(served, common_pb2.TenantPolicy(tenant_id=tenant, weight=weight))
        for tenant, weight in WEIGHTS.items()
    }
    # The scheduler hears a policy over its stream after the control plane commits it: a call
    # of each tenant first, so every caller starts under its tenant's weight.
    for md in keys.values():
        await _embed(served, md)()
    served_calls: Counter[str] = Counter()
    failures: Counter[tuple[str, str]] = Counter()
    began = time.monotonic()
    window = (began + WARM_UP_S, began + WARM_UP_S + seconds)

    async def caller(tenant: str) -> None:
        embed = _embed(served, keys[tenant])
        while time.monotonic() < window[1]:
            try:
                await embed()
            except grpc.aio.AioRpcError as error:
                failures[(tenant, error_reason(error) or error.code().name)] += 1
                continue
            if window[0] <= time.monotonic() < window[1]:
                served_calls[tenant] += 1

    say(f"shares: {callers} callers per tenant, weights {WEIGHTS}, Embeds of {len(SENTENCES)} "
        f"sentences, {WARM_UP_S:g}s warm-up, then {seconds:g}s counted")  # fmt: skip
    await asyncio.gather(*(caller(t) for t in WEIGHTS for _ in range(callers)))
    for tenant in WEIGHTS:
        rate = served_calls[tenant] / seconds
        say(f"  {tenant:6} weight {WEIGHTS[tenant]}: {served_calls[tenant]:6} calls served "
            f"({rate:6.1f}/s, {rate * len(SENTENCES):7.1f} sentences/s)")  # fmt: skip
    for (tenant, reason), count in sorted(failures.items()):
        say(f"  {tenant} failed {count} calls: {reason}")
    if not served_calls["light"]:
        say("  light was served nothing: no ratio")
        return 1
    ratio = served_calls["heavy"] / served_calls["light"]
    say(f"  heavy : light = 1 : {ratio:.2f} (target 1 : 3, bound 1 : 2.70)")
    return 0 if ratio >= 2.70 and not failures else 1


async def queue_depth(served: Served) -> int:
    md = await _tenant_key(served, common_pb2.TenantPolicy(tenant_id="bounded", max_queue_depth=2))
    embed = _embed(served, md)
    await embed()  # the scheduler holds the policy before the flood
    say(f"queue depth: tenant `bounded` (max_queue_depth 2) sends {FLOOD} Embeds of "
        f"{len(SENTENCES)} sentences at once")  # fmt: skip
    outcomes: Counter[str] = Counter()

    async def one() -> None:
        try:
            await embed()
            outcomes["served"] += 1
        except grpc.aio.AioRpcError as error:
            outcomes[error_reason(error) or error.code().name] += 1

    await asyncio.gather(*(one() for _ in range(FLOOD)))
    refused = sum(count for outcome, count in outcomes.items() if outcome != "served")
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(outcomes.items()) if r != "served")
    say(f"  {outcomes['served']} served, {refused} of {FLOOD} refused: {reasons}")
    return 0 if outcomes["QUEUE_FULL"] >= FLOOD - 8 else 1


async def abandoned(served: Served) -> int:
    keys = {
        tenant: await _tenant_key(served, common_pb2.TenantPolicy(tenant_id=tenant))
        for tenant in ("heavy", "light")
    }
    for md in keys.values():
        await _embed(served, md)()  # both policies reached the scheduler; the model is warm
    big = inference_pb2.EmbedRequest(
        capability=CAPABILITY,
        inputs=[f"{i} " + "abandoned work " * 533 for i in range(1024)],  # ~8,000 characters
        truncate=True,
    )
    small = inference_pb2.EmbedRequest(capability=CAPABILITY, inputs=["one sentence"])
    deadline_s = 10.0
    began = time.monotonic()
    heavy = [
        asyncio.ensure_future(
            served.inference.Embed(big, metadata=keys["heavy"], timeout=deadline_s)
        )
        for _ in range(4)
    ]
    # Light's call goes once the scheduler holds all four of heavy's (queued or in flight).
    await poll(
        lambda: _holds(served, "heavy", 4),
        deadline_s,
        "the scheduler to hold heavy's four Embeds",
        interval_s=0.05,
    )
    sent = time.monotonic()
    await served.inference.Embed(small, metadata=keys["light"], timeout=CALL_TIMEOUT_S)
    answered = time.monotonic()
    outcomes: Counter[str] = Counter()
    for call in heavy:
        try:
            await call
            outcomes["answered"] += 1
        except grpc.aio.AioRpcError as error:
            outcomes[error_reason(error) or error.code().name] += 1
    abandoned_at = began + deadline_s
    say(f"abandoned: heavy's four Embeds of 1,024 x ~8,000 characters: {dict(outcomes)}")
    after_send, after_abandonment = answered - sent, answered - abandoned_at
    say(f"  light's one-sentence Embed answered {after_send:.2f} s after its send, "
        f"{after_abandonment:+.2f} s from the abandonment (bound: within 5 s of it)")  # fmt: skip
    return 0 if after_abandonment <= 5.0 else 1


async def _holds(served: Served, tenant_id: str, calls: int) -> bool:
    """Whether the scheduler holds at least `calls` of the tenant's calls, queued or in flight."""
    snapshot = await queue_snapshot(served)
    return any(
        load.queued + load.in_flight >= calls
        for load in snapshot.tenants
        if load.tenant_id == tenant_id
    )


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue-depth", action="store_true", help="the max_queue_depth flood")
    parser.add_argument("--abandoned", action="store_true", help="four abandoned maximum Embeds")
    parser.add_argument("--seconds", type=float, default=30.0, help="counted window (shares)")
    parser.add_argument("--callers", type=int, default=24, help="callers per tenant (shares)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gantry-tenant-shares-") as base:
        say(f"starting `gantry up --device cpu` under {base} (the first start may take minutes)")
        progress: Callable[[str], None] = lambda line: say(f"  gantry up: {line}")  # noqa: E731
        async with gantry_up(
            Path(base), device="cpu", progress=progress, up_args=("--no-metrics",)
        ) as served:
            if args.queue_depth:
                return await queue_depth(served)
            if args.abandoned:
                return await abandoned(served)
            return await shares(served, seconds=args.seconds, callers=args.callers)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))

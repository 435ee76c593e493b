"""The documented client settings for Gantry's front doors, and `client_channel`, the one channel
the CLI makes to them.

A client that calls several control-plane replicas keeps working when one of them dies: the
channel balances round robin over every replica (a dead one is skipped once its connection
fails), and retries an idempotent call answered UNAVAILABLE (a call in flight on a replica that
died), up to 5 attempts, with gRPC's retry throttling so that a fleet that is down is not
hammered. Writes are never retried: a write whose replica died mid-call may have committed.
`SERVICE_CONFIG` is that policy as gRPC's service config; docs/contracts.md prints it verbatim
for other clients (tests/unit/test_client_config.py keeps the two equal).

Addresses: one address is handed to gRPC as it is (`host:port`, `dns:///name:port`, `ipv4:...`,
`unix:...`): a DNS name listing several A records is balanced over all of them, and gRPC
resolves it again when a connection fails. Several addresses (`a:50051,b:50051`) become one
static `ipv4:`/`ipv6:` target: gRPC's static schemes take IP literals only, so each name is
resolved once, when the channel is made (the decision is `plan_target`, pure; `resolve_hosts`
is the IO).
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import grpc

from gantry.common.errors import GantryError
from gantry.common.grpc_server import CHANNEL_OPTIONS, MESSAGE_LIMIT_BYTES
from gantry.common.tls import ClientTls

# The ControlPlane methods that only read: retrying one cannot change what is stored. Every
# other ControlPlane method writes (registers, creates, approves, starts a job, deletes) and is
# not retried. CheckDeploymentHealth starts HEALTH jobs, so it is a write.
CONTROL_PLANE_READS: tuple[str, ...] = (
    "GetNode",
    "ListNodes",
    "GetArtifactSet",
    "ListArtifactSets",
    "GetAssessment",
    "ListAssessments",
    "GetRuntimeProfile",
    "ListRuntimeProfiles",
    "GetProbe",
    "ListProbes",
    "GetDeploymentCandidate",
    "ListDeploymentCandidates",
    "GetApproval",
    "ListApprovals",
    "GetDeployment",
    "ListDeployments",
    "GetCapabilityBinding",
    "ListCapabilityBindings",
    "ListApiKeys",
    "GetServingJob",
    "ListServingJobs",
    "CheckInvariants",
    "GetTenantPolicy",
    "ListTenants",
    "GetQueueSnapshot",
    "GetRegistrySnapshot",
    "GetDebugSnapshot",
    "GetInventory",
    "ListAuditEvents",
    # A stream is retried only until its first event arrives; after that the caller resumes
    # from the last event id it holds (gantry events --follow does).
    "WatchAuditEvents",
    "ListStateTransitions",
    "ListEndpoints",
)
# Every method of these services is idempotent: an inference changes nothing stored, so the
# worst a retry costs is the work of a call whose answer was lost.
IDEMPOTENT_SERVICES: tuple[str, ...] = ("gantry.v1.Inference", "inference.GRPCInferenceService")

RETRY_POLICY: Mapping[str, Any] = {
    "maxAttempts": 5,  # gRPC's ceiling: a larger value is cut to 5
    "initialBackoff": "0.1s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
# Each failed attempt costs a token, each success gives back tokenRatio; retries stop while
# tokens <= maxTokens / 2. The calls in flight on a replica that dies all fail at once, so
# maxTokens bounds how many of them can be retried: 10 retries only 5, and
# tests/integration/test_client_replicas.py (16 and more in flight on a SIGKILLed replica) then
# loses calls; 1,000 (gRPC's ceiling) retries up to 500. Under a lasting outage the ratio still
# stops retries once more than about 1 attempt in 11 fails.
RETRY_THROTTLING: Mapping[str, Any] = {"maxTokens": 1000, "tokenRatio": 0.1}

SERVICE_CONFIG: Mapping[str, Any] = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [
        {
            "name": [
                *({"service": service} for service in IDEMPOTENT_SERVICES),
                *(
                    {"service": "gantry.v1.ControlPlane", "method": method}
                    for method in CONTROL_PLANE_READS
                ),
            ],
            "retryPolicy": RETRY_POLICY,
        }
    ],
    "retryThrottling": RETRY_THROTTLING,
}

# gRPC retries a call only while it still holds the request: past this many bytes sent it stops
# buffering and the call cannot be retried. gRPC's default (256 KiB) is less than one large Embed
# or an image; this is what a Gantry channel may send at all.
RETRY_BUFFER_BYTES = MESSAGE_LIMIT_BYTES


# Keepalive while calls are in flight, and only then: a replica that stops answering without
# closing its connections (SIGSTOP, a hung host, a partition) is found by an unanswered HTTP/2
# ping within KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS (3 s), and its calls fail UNAVAILABLE
# before they have an answer, so the retry policy sends them to another replica (measured: a
# call held by a SIGSTOPped server answered by the other after 3.1 s). Without it they waited
# for their deadline (the replica chaos suite, case C: 20 of 104 calls). gRPC's own
# acknowledgement of a ping needs no Python, so a busy replica answers it. An idle channel sends
# none. Gantry's servers accept a ping every 0.5 s (grpc_server.server_options); another client
# pinging a server more often than its policy allows is sent GOAWAY (too_many_pings).
CLIENT_KEEPALIVE: tuple[tuple[str, Any], ...] = (
    ("grpc.keepalive_time_ms", 1_000),
    ("grpc.keepalive_timeout_ms", 2_000),
    # gRPC core (1.85) waits for a ping's answer this long, not keepalive_timeout_ms (its
    # default is a minute): without it a stopped replica's calls still waited for their deadline.
    ("grpc.http2.ping_timeout_ms", 2_000),
    ("grpc.keepalive_permit_without_calls", 0),
)
_CLIENT_KEEPALIVE_KEYS = {key for key, _ in CLIENT_KEEPALIVE}


def client_channel_options() -> tuple[tuple[str, Any], ...]:
    """The channel arguments every client channel carries: the shared limits, the client's
    keepalive, the service config, and a retry buffer as large as a message."""
    return (
        *(option for option in CHANNEL_OPTIONS if option[0] not in _CLIENT_KEEPALIVE_KEYS),
        *CLIENT_KEEPALIVE,
        ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
        ("grpc.enable_retries", 1),
        ("grpc.per_rpc_retry_buffer_size", RETRY_BUFFER_BYTES),
    )


@dataclass(frozen=True, slots=True)
class ClientTarget:
    """What gRPC dials, and the authority (the `:authority` header and the name TLS verifies)
    when the target is a static list that names none of its own."""

    target: str
    authority: str | None = None


def _refused(message: str, address: str) -> GantryError:
    return GantryError("INVALID_ARGUMENT", message, field="address", address=address)


def split_addresses(text: str) -> tuple[str, ...]:
    """`a:1,b:2` → ("a:1", "b:2"), spaces around each ignored; an empty entry is refused."""
    addresses = tuple(part.strip() for part in text.split(","))
    if not all(addresses):
        raise _refused(f"an empty address in {text!r} (HOST:PORT,HOST:PORT,...)", text)
    return addresses


def host_and_port(address: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` of one address of a list, which needs a port of its own."""
    host, colon, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host or "/" in address:
        host = ""  # a bare IPv6 literal or a scheme: not HOST:PORT
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _refused(
            f"{address!r} is not HOST:PORT; each address of a list needs both (an IPv6 host in "
            "brackets: [::1]:50051; a scheme such as dns:/// only as the one address)",
            address,
        )
    return host, int(port)


def _ip_literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def _family_of_all(resolved: Sequence[Sequence[str]]) -> int | None:
    """IPv4 when every address has one, else IPv6 when every one has that: one static target
    takes one family only."""
    for version in (4, 6):
        if all(any(ipaddress.ip_address(ip).version == version for ip in ips) for ips in resolved):
            return version
    return None


def plan_target(addresses: Sequence[str], resolved: Mapping[str, Sequence[str]]) -> ClientTarget:
    """The target for `addresses`, given each host's IPs (`resolve_hosts`): one address as it
    is; several as one `ipv4:`/`ipv6:` list of every IP of every replica that resolved. A name
    that does not resolve is left out (a stopped container's name leaves Docker's DNS); none
    resolving is refused. Pure."""
    if len(addresses) == 1:
        return ClientTarget(addresses[0])
    endpoints = [host_and_port(address) for address in addresses]
    live = [(resolved[host], port) for host, port in endpoints if resolved.get(host)]
    if not live:
        raise _refused(f"no host of {','.join(addresses)} resolves to an address", addresses[0])
    version = _family_of_all([ips for ips, _ in live])
    if version is None:
        raise _refused(
            f"{','.join(addresses)} mixes hosts with only IPv4 and only IPv6 addresses; "
            "one list takes one family",
            addresses[0],
        )
    listed: list[str] = []
    for ips, port in live:
        for ip in ips:
            entry = f"{ip}:{port}" if version == 4 else f"[{ip}]:{port}"
            if ipaddress.ip_address(ip).version == version and entry not in listed:
                listed.append(entry)
    # The default authority of a static list is the list itself, which no certificate names:
    # the first address stands for the service.
    return ClientTarget(f"ipv{version}:{','.join(listed)}", authority=addresses[0])


Resolver = Callable[[Sequence[str]], Mapping[str, Sequence[str]]]


def resolve_hosts(hosts: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Each host's IPs, in the resolver's order; an IP literal is itself, a name that does not
    resolve (now) has none."""
    found: dict[str, tuple[str, ...]] = {}
    for host in hosts:
        literal = _ip_literal(host)
        if literal is not None:
            found[host] = (literal,)
            continue
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            found[host] = ()
            continue
        found[host] = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
    return found


def client_target(addresses: Sequence[str], *, resolve: Resolver = resolve_hosts) -> ClientTarget:
    """`plan_target` over the hosts `resolve` found; nothing is resolved for one address."""
    if not addresses:
        raise _refused("no address to call", "")
    if len(addresses) == 1:
        return plan_target(addresses, {})
    hosts = [host_and_port(address)[0] for address in addresses]
    return plan_target(addresses, resolve(hosts))


@overload
def client_channel(
    addresses: Sequence[str],
    *,
    tls: ClientTls | None = ...,
    options: Sequence[tuple[str, Any]] = ...,
    asynchronous: Literal[False] = ...,
    resolve: Resolver = ...,
) -> grpc.Channel: ...


@overload
def client_channel(
    addresses: Sequence[str],
    *,
    tls: ClientTls | None = ...,
    options: Sequence[tuple[str, Any]] = ...,
    asynchronous: Literal[True],
    resolve: Resolver = ...,
) -> grpc.aio.Channel: ...


def client_channel(
    addresses: Sequence[str],
    *,
    tls: ClientTls | None = None,
    options: Sequence[tuple[str, Any]] = (),
    asynchronous: bool = False,
    resolve: Resolver = resolve_hosts,
) -> grpc.Channel | grpc.aio.Channel:
    """A channel to one or several replicas of a Gantry front door with `SERVICE_CONFIG`: TLS
    with `tls` (every replica verified as the first address's host, or as tls.server_name),
    plaintext without; `options` are added (a caller's reconnect backoff). `asynchronous` gives
    a grpc.aio channel."""
    target = client_target(addresses, resolve=resolve)
    arguments = [*client_channel_options(), *options]
    if target.authority is not None:
        arguments.append(("grpc.default_authority", target.authority))
    if tls is not None:
        arguments.extend(tls.channel_options())
    if asynchronous:
        if tls is None:
            return grpc.aio.insecure_channel(target.target, options=arguments)
        return grpc.aio.secure_channel(target.target, tls.credentials(), options=arguments)
    if tls is None:
        return grpc.insecure_channel(target.target, options=arguments)
    return grpc.secure_channel(target.target, tls.credentials(), options=arguments)

"""The client service config and how a list of replicas becomes one gRPC target: which methods
are retried (reads and inference, never a write), the documented JSON equal to the code's, and
the target planned for one address, a list of IPs, names, IPv6 and names that do not resolve."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from gantry.common.client_config import (
    CONTROL_PLANE_READS,
    SERVICE_CONFIG,
    ClientTarget,
    client_channel_options,
    client_target,
    host_and_port,
    plan_target,
    resolve_hosts,
    split_addresses,
)
from gantry.common.errors import GantryError
from gantry.common.grpc_server import SERVER_OPTIONS
from gantry.v1 import control_plane_pb2

CONTRACTS = Path(__file__).resolve().parents[2] / "docs" / "contracts.md"
SECTION = "## Clients and replicas"
JSON_BLOCK = re.compile(r"^```json\n(.*?)^```", re.M | re.S)

CONTROL_PLANE = control_plane_pb2.DESCRIPTOR.services_by_name["ControlPlane"]
# Verbs that change what is stored: a method named so must never be retried.
WRITE_VERBS = (
    "Register",
    "Create",
    "Approve",
    "Start",
    "Cancel",
    "Disable",
    "Enable",
    "Delete",
    "Unload",
    "Restart",
    "Scale",
    "Bind",
    "Revoke",
    "Rotate",
    "Set",
    "Reclaim",
    "Adopt",
    "Assess",
    "Drain",
    "CheckDeploymentHealth",
)


def retried_names() -> list[dict[str, str]]:
    (method_config,) = SERVICE_CONFIG["methodConfig"]
    return list(method_config["name"])


def test_every_listed_read_is_a_control_plane_method() -> None:
    methods = {method.name for method in CONTROL_PLANE.methods}
    assert set(CONTROL_PLANE_READS) <= methods
    assert len(set(CONTROL_PLANE_READS)) == len(CONTROL_PLANE_READS)


def test_every_get_list_and_watch_method_is_retried() -> None:
    """A read added to the proto and forgotten here would lose calls to a dying replica."""
    reads = {
        method.name
        for method in CONTROL_PLANE.methods
        if method.name.startswith(("Get", "List", "Watch"))
    }
    assert reads <= set(CONTROL_PLANE_READS)


def test_no_write_is_retried() -> None:
    assert [name for name in CONTROL_PLANE_READS if name.startswith(WRITE_VERBS)] == []
    # Every ControlPlane entry names its method: the service as a whole is never retried.
    control_plane = [n for n in retried_names() if n["service"] == "gantry.v1.ControlPlane"]
    assert all("method" in name for name in control_plane)
    assert [n["method"] for n in control_plane] == list(CONTROL_PLANE_READS)


def test_inference_and_kserve_are_retried_whole() -> None:
    whole = [n["service"] for n in retried_names() if "method" not in n]
    assert whole == ["gantry.v1.Inference", "inference.GRPCInferenceService"]


def test_the_policy_is_round_robin_with_throttled_retries_on_unavailable() -> None:
    (method_config,) = SERVICE_CONFIG["methodConfig"]
    assert SERVICE_CONFIG["loadBalancingConfig"] == [{"round_robin": {}}]
    assert method_config["retryPolicy"] == {
        "maxAttempts": 5,
        "initialBackoff": "0.1s",
        "maxBackoff": "1s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    assert SERVICE_CONFIG["retryThrottling"] == {"maxTokens": 1000, "tokenRatio": 0.1}


def test_the_documented_service_config_is_the_code_s() -> None:
    text = CONTRACTS.read_text()
    assert SECTION in text
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    block = JSON_BLOCK.search(section)
    assert block is not None, f"no json block under {SECTION!r}"
    assert json.loads(block.group(1)) == json.loads(json.dumps(SERVICE_CONFIG))


def test_the_channel_carries_the_service_config_and_a_message_sized_retry_buffer() -> None:
    options = dict(client_channel_options())
    assert json.loads(options["grpc.service_config"]) == json.loads(json.dumps(SERVICE_CONFIG))
    assert options["grpc.per_rpc_retry_buffer_size"] == options["grpc.max_send_message_length"]


# ---- addresses ----------------------------------------------------------------------------------


def refusal(call: object) -> GantryError:
    with pytest.raises(GantryError) as raised:
        call()  # type: ignore[operator]
    assert raised.value.reason == "INVALID_ARGUMENT"
    assert raised.value.metadata["field"] == "address"
    return raised.value


def test_a_comma_separated_list_is_split_and_an_empty_entry_refused() -> None:
    assert split_addresses("a:1") == ("a:1",)
    assert split_addresses(" a:1 , b:2 ") == ("a:1", "b:2")
    assert "empty address" in refusal(lambda: split_addresses("a:1,,b:2")).message
    refusal(lambda: split_addresses("a:1,"))


def test_each_address_of_a_list_is_host_and_port() -> None:
    assert host_and_port("cp-1.internal:50051") == ("cp-1.internal", 50051)
    assert host_and_port("[::1]:50051") == ("::1", 50051)
    for bad in ("cp-1", "cp-1:", "cp-1:http", "::1:50051", "dns:///cp:50051", "cp:0", "cp:70000"):
        assert bad in refusal(lambda bad=bad: host_and_port(bad)).message


def test_one_address_is_handed_to_grpc_as_it_is() -> None:
    for address in ("127.0.0.1:50051", "dns:///gantry.internal:50051", "unix:/run/g.sock"):
        assert plan_target([address], {}) == ClientTarget(address)


def test_a_list_becomes_one_static_ipv4_target_named_by_its_first_address() -> None:
    resolved = {"cp-1": ["10.0.0.1"], "cp-2": ["10.0.0.2", "10.0.0.3"], "10.0.0.9": ["10.0.0.9"]}
    target = plan_target(["cp-1:50051", "cp-2:50052", "10.0.0.9:7"], resolved)
    assert target == ClientTarget(
        "ipv4:10.0.0.1:50051,10.0.0.2:50052,10.0.0.3:50052,10.0.0.9:7", authority="cp-1:50051"
    )


def test_a_name_that_does_not_resolve_is_left_out_and_none_resolving_is_refused() -> None:
    target = plan_target(["gone:50051", "cp-2:50051"], {"gone": [], "cp-2": ["10.0.0.2"]})
    assert target == ClientTarget("ipv4:10.0.0.2:50051", authority="gone:50051")
    assert "resolves" in refusal(lambda: plan_target(["a:1", "b:1"], {"a": [], "b": []})).message


def test_ipv6_when_only_ipv6_is_common_and_mixed_families_are_refused() -> None:
    target = plan_target(["[::1]:1", "six:2"], {"::1": ["::1"], "six": ["fd00::2"]})
    assert target.target == "ipv6:[::1]:1,[fd00::2]:2"
    both = {"localhost": ["::1", "127.0.0.1"], "127.0.0.1": ["127.0.0.1"]}
    assert (
        plan_target(["localhost:1", "127.0.0.1:2"], both).target == "ipv4:127.0.0.1:1,127.0.0.1:2"
    )
    mixed = {"four": ["10.0.0.1"], "six": ["fd00::2"]}
    assert "one family" in refusal(lambda: plan_target(["four:1", "six:2"], mixed)).message


def test_the_same_replica_twice_is_dialled_once() -> None:
    target = plan_target(["127.0.0.1:1", "127.0.0.1:1"], {"127.0.0.1": ["127.0.0.1"]})
    assert target.target == "ipv4:127.0.0.1:1"


def test_client_target_resolves_only_for_a_list() -> None:
    asked: list[Sequence[str]] = []

    def resolve(hosts: Sequence[str]) -> dict[str, list[str]]:
        asked.append(hosts)
        return {host: ["10.1.1.1"] for host in hosts}

    assert client_target(["cp:1"], resolve=resolve) == ClientTarget("cp:1")
    assert asked == []
    assert client_target(["cp:1", "cq:2"], resolve=resolve).target.startswith("ipv4:")
    assert asked == [["cp", "cq"]]
    refusal(lambda: client_target([], resolve=resolve))


def test_resolve_hosts_keeps_ip_literals_and_reads_localhost() -> None:
    found = resolve_hosts(["127.0.0.1", "::1", "localhost"])
    assert found["127.0.0.1"] == ("127.0.0.1",) and found["::1"] == ("::1",)
    assert "127.0.0.1" in found["localhost"] or "::1" in found["localhost"]


def test_the_documented_python_snippet_uses_names_that_exist() -> None:
    section = CONTRACTS.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    snippet = re.search(r"^```python\n(.*?)^```", section, re.M | re.S)
    assert snippet is not None
    code = compile(snippet.group(1), "docs/contracts.md", "exec")
    # Only what it imports is run: the channels it makes would dial replicas that are not here.
    imports = [
        line for line in snippet.group(1).splitlines() if line.startswith(("from", "import"))
    ]
    exec("\n".join(imports), {})
    assert "client_channel" in code.co_names


def test_the_channel_pings_while_calls_are_in_flight_and_each_option_once() -> None:
    """A replica that stops answering is found by keepalive, not by the call's deadline: a ping a
    second while calls are in flight, none on an idle channel; no argument given twice (which of
    two gRPC would take is not ours to rely on)."""
    pairs = client_channel_options()
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys))
    options = dict(pairs)
    assert options["grpc.keepalive_time_ms"] == 1_000
    assert options["grpc.keepalive_timeout_ms"] == 2_000
    assert options["grpc.http2.ping_timeout_ms"] == 2_000
    assert options["grpc.keepalive_permit_without_calls"] == 0


def test_servers_accept_the_client_s_pings() -> None:
    """A ping sooner than the server's minimum is a strike and two strikes end the connection:
    the server's minimum must be below the client's interval."""
    server = dict(SERVER_OPTIONS)
    client = dict(client_channel_options())
    assert (
        server["grpc.http2.min_recv_ping_interval_without_data_ms"]
        < client["grpc.keepalive_time_ms"]
    )

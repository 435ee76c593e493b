"""Channels to the control plane, the bearer-token metadata, and paging through list RPCs."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from gantry.cli.state import StatePaths, read_secret

ADDRESS_ENV = "GANTRY_ADDRESS"
DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_TIMEOUT_S = 30.0
PAGE_SIZE = 100

Metadata = Sequence[tuple[str, str]]
Item = TypeVar("Item")


def bearer(token: str) -> Metadata:
    return (("authorization", f"Bearer {token}"),)


def open_channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address)


def paged(
    call: Callable[..., Any],
    request_type: Callable[..., Any],
    items: Callable[[Any], Sequence[Item]],
    *,
    metadata: Metadata,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Iterator[Item]:
    """Every item of a list RPC: follow `next_page_token` until the server returns an empty one."""
    token = ""
    while True:
        response = call(
            request_type(page_size=PAGE_SIZE, page_token=token),
            metadata=metadata,
            timeout=timeout_s,
        )
        yield from items(response)
        token = response.next_page_token
        if not token:
            return


@dataclass(frozen=True, slots=True)
class CommandContext:
    """What every command gets from the global options."""

    address: str
    paths: StatePaths

    def operator_metadata(self) -> Metadata:
        return bearer(read_secret(self.paths.operator_token, what="operator token"))

    def client_metadata(self) -> Metadata:
        return bearer(read_secret(self.paths.client_key, what="client API key"))

"""Channels to the control plane (TLS when configured), bearer-token metadata, paging.

Every channel the CLI opens is `gantry.common.client_config.client_channel`: round robin over
the control-plane replicas an address names (`a:50051,b:50051`), idempotent calls retried on
UNAVAILABLE. Which replicas: --address, else $GANTRY_ADDRESS, else `<state>/control-planes`
(one address per line), else 127.0.0.1:50051 (`command_address`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from gantry.cli.click_parser import CommandSpec
from gantry.cli.errors import CliError
from gantry.cli.state import StatePaths, read_secret
from gantry.common.client_config import client_channel, split_addresses
from gantry.common.tls import ClientTls, client_tls_from

ADDRESS_ENV = "GANTRY_ADDRESS"
DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_TIMEOUT_S = 30.0
PAGE_SIZE = 100

Metadata = Sequence[tuple[str, str]]
Item = TypeVar("Item")


def bearer(token: str) -> Metadata:
    return (("authorization", f"Bearer {token}"),)


def open_channel(
    address: str, tls: ClientTls | None = None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.Channel:
    """A channel to the replicas `address` lists, comma-separated (one address: as it is)."""
    return client_channel(split_addresses(address), tls=tls, options=options)


def read_control_planes(path: Path) -> str | None:
    """The replicas listed in `path`, one address per line (blank lines and `#` comments
    ignored), as one comma-separated address; None when the file does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    lines = (line.partition("#")[0].strip() for line in text.splitlines())
    addresses = [line for line in lines if line]
    if not addresses:
        raise CliError(f"{path} lists no control-plane address (one HOST:PORT per line)")
    if any("," in address for address in addresses):
        raise CliError(f"{path}: one address per line, without commas")
    return ",".join(addresses)


def command_address(flag: str | None, env: Mapping[str, str], paths: StatePaths | None) -> str:
    """--address, else $GANTRY_ADDRESS, else the state directory's control-planes file (when
    `paths` is given and it exists), else the default; each may list several replicas."""
    address = flag or env.get(ADDRESS_ENV) or None
    if address is None and paths is not None:
        address = read_control_planes(paths.control_planes)
    address = address or DEFAULT_ADDRESS
    split_addresses(address)  # a malformed list is refused before any command runs
    return address


def local_tls(paths: StatePaths) -> ClientTls | None:
    """The CA of a `gantry up --tls` serving this state directory."""
    if not (paths.tls_enabled.exists() and paths.tls_ca.exists()):
        return None
    return ClientTls(ca_file=paths.tls_ca)


def command_tls(
    args: argparse.Namespace, paths: StatePaths, env: Mapping[str, str] | None = None
) -> ClientTls | None:
    """--tls-* flags, else GANTRY_TLS_* variables, else the local `gantry up --tls` CA."""
    explicit = client_tls_from(args, env=os.environ if env is None else env)
    return explicit if explicit is not None else local_tls(paths)


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

    address: str  # one control plane, or several replicas comma-separated
    paths: StatePaths
    tls: ClientTls | None = None

    def open_channel(self) -> grpc.Channel:
        return open_channel(self.address, self.tls)

    def operator_metadata(self) -> Metadata:
        return bearer(
            read_secret(self.paths.operator_token, what="operator token", state=self.paths)
        )

    def client_metadata(self) -> Metadata:
        return bearer(read_secret(self.paths.client_key, what="client API key", state=self.paths))


# What a subcommand runs, and main.py's `command(name, handler, help)` that registers one: the
# modules that own a command add it through this, so every command gets the global options.
Handler = Callable[[CommandContext, argparse.Namespace], int]
AddCommand = Callable[[str, Handler, str], CommandSpec]

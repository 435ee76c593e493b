"""What the blocking and the asyncio client share: their arguments, the channel they open (the
documented service config of gantry.common.client_config: round robin over several addresses,
UNAVAILABLE retried for these idempotent calls, with retry throttling) and one callable per RPC.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

from gantry.client.calls import RPCS, Call
from gantry.client.settings import DEFAULT_TIMEOUT_S, Target, connection_settings, timeout_of
from gantry.common.client_config import client_channel


class Connection:
    """A channel to one or several Gantry control planes and the key its calls carry."""

    _asynchronous: ClassVar[bool]

    def __init__(
        self,
        target: Target,
        *,
        api_key: str | None = None,
        key_file: str | os.PathLike[str] | None = None,
        root_certificates: str | os.PathLike[str] | None = None,
        tls: bool = False,
        server_name: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`target`: "host:port", several comma-separated, or a list of them. The key, first
        found: `api_key`, `key_file` (a file holding it), GANTRY_API_KEY in `env` (default
        os.environ). TLS: `root_certificates` (a PEM file to verify the server with) or
        `tls=True` (the system's roots); `server_name` verifies the server as that name.
        `timeout`: each call's deadline in seconds unless the call gives its own."""
        self.settings = connection_settings(
            target,
            api_key=api_key,
            key_file=key_file,
            root_certificates=root_certificates,
            tls=tls,
            server_name=server_name,
            timeout=timeout,
            env=os.environ if env is None else env,
        )
        addresses, secure = self.settings.addresses, self.settings.tls
        self._channel: Any = (
            client_channel(addresses, tls=secure, asynchronous=True)
            if self._asynchronous
            else client_channel(addresses, tls=secure)
        )
        self._callables = {method: rpc.multicallable(self._channel) for method, rpc in RPCS.items()}

    def _start(self, call: Call[Any], timeout: float | None) -> Any:
        """Start `call` on the channel (a response, a future or a stream, by client and RPC)."""
        return self._callables[call.rpc.method](
            call.request,
            timeout=timeout_of(timeout, self.settings.timeout_s),
            metadata=self.settings.metadata,
        )

"""What a client is built from: the addresses it dials, the API key it sends, TLS and the default
deadline, decided from its arguments and the environment (pure; `connection_settings` reads only
the key and certificate files it is pointed at).

The API key, first found wins:
1. `api_key=`, the key itself;
2. `key_file=`, a file holding it (as `gantry up` writes `.gantry/client.key`);
3. `GANTRY_API_KEY` in the environment.
`api_key=` and `key_file=` together are refused: one of them would be ignored.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gantry.common.auth import auth_metadata
from gantry.common.client_config import split_addresses
from gantry.common.tls import ClientTls

API_KEY_ENV = "GANTRY_API_KEY"
# A call's deadline when it names none: long enough for a cold capability's first call on a busy
# CPU node, short enough that a lost answer does not hang a caller for good.
DEFAULT_TIMEOUT_S = 60.0

Target = str | Sequence[str]


class ClientSettingsError(ValueError):
    """Arguments a client cannot be built from (no key, an empty address, a bad timeout)."""


def addresses_of(target: Target) -> tuple[str, ...]:
    """One address, several comma-separated, or a list of them, as a tuple (at least one)."""
    parts = [target] if isinstance(target, str) else list(target)
    addresses = tuple(address for part in parts for address in _split(part))
    if not addresses:
        raise ClientSettingsError("no address to call: give HOST:PORT, or several")
    return addresses


def _split(part: str) -> tuple[str, ...]:
    try:
        return split_addresses(part)
    except Exception as error:  # gantry.common's GantryError, said as a settings error here
        raise ClientSettingsError(str(error)) from None


def api_key_of(
    *, api_key: str | None, key_file_text: str | None, key_file: str, env: Mapping[str, str]
) -> str:
    """The key by the module's precedence; `key_file_text` is what `key_file` holds."""
    if api_key is not None and key_file_text is not None:
        raise ClientSettingsError("give api_key= or key_file=, not both")
    if api_key is not None:
        key, source = api_key.strip(), "api_key="
    elif key_file_text is not None:
        key, source = key_file_text.strip(), f"key_file {key_file}"
    elif env.get(API_KEY_ENV, "").strip():
        return env[API_KEY_ENV].strip()
    else:
        raise ClientSettingsError(
            f"no API key: pass api_key=, key_file= (e.g. .gantry/client.key) or set {API_KEY_ENV}"
        )
    if not key:
        raise ClientSettingsError(f"the API key from {source} is empty")
    return key


def timeout_of(timeout: float | None, default: float) -> float:
    """A call's deadline in seconds: its own, else the client's default. Positive and finite."""
    seconds = default if timeout is None else timeout
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ClientSettingsError(f"timeout must be a positive number of seconds, not {seconds!r}")
    return float(seconds)


@dataclass(frozen=True, kw_only=True)
class ConnectionSettings:
    """Everything a client's channel and calls need, decided once when the client is built."""

    addresses: tuple[str, ...]
    metadata: tuple[tuple[str, str], ...]  # the bearer key, sent with every call
    tls: ClientTls | None  # None: plaintext
    timeout_s: float


def connection_settings(
    target: Target,
    *,
    api_key: str | None,
    key_file: str | os.PathLike[str] | None,
    root_certificates: str | os.PathLike[str] | None,
    tls: bool,
    server_name: str | None,
    timeout: float,
    env: Mapping[str, str],
) -> ConnectionSettings:
    """The settings of a client built with these arguments (reads `key_file` if given)."""
    key_file_text = Path(key_file).read_text() if key_file is not None else None
    key = api_key_of(api_key=api_key, key_file_text=key_file_text, key_file=str(key_file), env=env)
    secure = tls or root_certificates is not None or server_name is not None
    return ConnectionSettings(
        addresses=addresses_of(target),
        metadata=auth_metadata(key),
        tls=ClientTls(
            ca_file=Path(root_certificates) if root_certificates is not None else None,
            server_name=server_name,
        )
        if secure
        else None,
        timeout_s=timeout_of(timeout, DEFAULT_TIMEOUT_S),
    )

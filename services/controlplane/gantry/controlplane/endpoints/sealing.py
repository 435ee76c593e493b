"""Sealing adopted endpoints' credentials: Fernet (AES-128-CBC + HMAC-SHA256) under a key the
control plane keeps outside the database.

A credential cannot be hashed like Gantry's own tokens: the worker must send it to the server.
So the database holds only the sealed form, and the key lives in a 0600 file in the control
plane's state directory (created once by the first start that needs it) or in a deployment's
secret (deploy/README.md, "Secrets"), or, for an in-process control plane given no file, in
memory for the life of the process (its sealed credentials are then unreadable after a restart,
which a LOAD reports as LOAD_FAILED rather than sending junk).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from gantry.common.errors import GantryError

log = logging.getLogger(__name__)


class CredentialSealer:
    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)

    @classmethod
    def ephemeral(cls) -> CredentialSealer:
        return cls(Fernet.generate_key())

    @classmethod
    def from_key_file(cls, path: Path) -> CredentialSealer:
        """The key in `path`, minted (mode 0600, never overwritten) when the file is absent; a
        missing directory is made (0700)."""
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(Fernet.generate_key() + b"\n")
                handle.flush()
                os.fsync(handle.fileno())
            log.info("minted the endpoint credential sealing key at %s", path)
        mode = path.stat().st_mode & 0o777
        # Group read is how deployments hand the service its secrets (compose files 0640 and
        # Kubernetes Secret volumes 0440, both group 10001, the service's own group), so only
        # access by others or a group that may rewrite the key is refused.
        if mode & 0o027:
            raise GantryError(
                "INVALID_ARGUMENT",
                f"the sealing key file {path} is open to others or group-writable (mode "
                f"{mode:o}); chmod 600 (or 640 for the service's group) it",
            )
        return cls(path.read_bytes().strip())

    def seal(self, credential: str) -> str:
        """The sealed form to store; "" stays "" (no credential)."""
        if not credential:
            return ""
        return self._fernet.encrypt(credential.encode()).decode("ascii")

    def open(self, sealed: str, *, endpoint_id: str) -> str:
        if not sealed:
            return ""
        try:
            return self._fernet.decrypt(sealed.encode("ascii")).decode()
        except (InvalidToken, ValueError):
            raise GantryError(
                "LOAD_FAILED",
                f"the credential of adopted endpoint {endpoint_id} cannot be unsealed with this "
                "control plane's key (a different or lost key file); adopt the endpoint again",
                endpoint_id=endpoint_id,
            ) from None

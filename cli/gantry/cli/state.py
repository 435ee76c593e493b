"""The local state directory (`.gantry/`): which one a command uses, where each file lives, and
secrets written 0600."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gantry.cli.errors import CliError

DEFAULT_STATE_DIR = ".gantry"
STATE_DIR_ENV = "GANTRY_STATE_DIR"


@dataclass(frozen=True, slots=True)
class StatePaths:
    root: Path
    # How `root` was chosen, for errors that must say where a missing file was looked for.
    origin: str = "the default ./.gantry"

    @property
    def database(self) -> Path:
        return self.root / "gantry.db"

    @property
    def database_url(self) -> str:
        return f"sqlite+aiosqlite:///{self.database.resolve()}"

    @property
    def operator_token(self) -> Path:
        return self.root / "operator.token"

    @property
    def client_key(self) -> Path:
        return self.root / "client.key"

    @property
    def node_credential(self) -> Path:
        return self.root / "node.credential"

    @property
    def scheduler_token(self) -> Path:
        return self.root / "scheduler.token"

    @property
    def control_planes(self) -> Path:
        """The control-plane replicas client commands call, one HOST:PORT per line, when no
        --address or $GANTRY_ADDRESS names them (docs/contracts.md, "Clients and replicas")."""
        return self.root / "control-planes"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def tls(self) -> Path:
        """`gantry up --tls`: the local CA and every certificate it issued."""
        return self.root / "tls"

    @property
    def tls_ca(self) -> Path:
        return self.tls / "ca.pem"

    @property
    def tls_enabled(self) -> Path:
        """Present while the last `gantry up` served TLS: CLI commands then dial with tls_ca."""
        return self.tls / "enabled"

    def tls_files(self, name: str) -> tuple[Path, Path]:
        """(certificate, private key) issued to `name` by the local CA."""
        return self.tls / f"{name}.pem", self.tls / f"{name}.key"

    @property
    def lock(self) -> Path:
        return self.root / "up.lock"

    def log_file(self, role: str) -> Path:
        return self.logs / f"{role}.log"

    def create(self) -> None:
        # The directory holds secrets: keep it private to the user who runs Gantry.
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.artifacts.mkdir(exist_ok=True)
        self.logs.mkdir(exist_ok=True)


def locate_state_dir(
    *, flag: str | None, env: Mapping[str, str], cwd: Path, walk_up: bool = True
) -> StatePaths:
    """--state-dir, else $GANTRY_STATE_DIR, else the nearest directory from `cwd` up that holds a
    `.gantry/` (the project root of a `make run`), else ./.gantry.

    `walk_up=False` (gantry up) keeps the state where the command runs unless told otherwise:
    starting a second installation in a subdirectory must not adopt the parent's.
    """
    if flag:
        return StatePaths(Path(flag), origin="given by --state-dir")
    if env.get(STATE_DIR_ENV):
        return StatePaths(Path(env[STATE_DIR_ENV]), origin=f"given by ${STATE_DIR_ENV}")
    if walk_up:
        for directory in (cwd, *cwd.parents):
            if (directory / DEFAULT_STATE_DIR).is_dir():
                origin = (
                    "found in the working directory"
                    if directory == cwd
                    else f"found walking up from {cwd}"
                )
                return StatePaths(directory / DEFAULT_STATE_DIR, origin=origin)
        return StatePaths(
            Path(DEFAULT_STATE_DIR),
            origin=f"the default ./.gantry: no .gantry/ in {cwd} or any directory above it",
        )
    return StatePaths(Path(DEFAULT_STATE_DIR))


def write_secret(path: Path, value: str) -> None:
    """Write atomically, mode 0600: a reader never sees a half-written or world-readable secret."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.unlink(missing_ok=True)  # a leftover of a crashed write (never followed: below)
    # O_EXCL|O_NOFOLLOW: a file or symlink planted at the temporary name is refused, not written.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(value + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o600)  # O_CREAT's mode is filtered by the umask
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def read_secret(path: Path, *, what: str, state: StatePaths | None = None) -> str:
    """The secret in `path`; when it is missing, the error names the state directory looked in
    (`state`) and how it was chosen."""
    try:
        value = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        if state is None:
            raise CliError(
                f"no {what} at {path}; start Gantry with `gantry up` (or pass --state-dir)"
            ) from None
        raise CliError(
            f"no {what} at {path}: looked in the state directory {state.root.absolute()}"
            f" ({state.origin}); start Gantry there with `gantry up`, or name the directory"
            f" of a running Gantry with --state-dir DIR or {STATE_DIR_ENV}=DIR"
        ) from None
    except OSError as exc:
        raise CliError(f"cannot read the {what} at {path}: {exc.strerror}") from None
    if not value:
        raise CliError(f"the {what} file {path} is empty")
    return value


def ensure_secret(path: Path, mint: Callable[[], str]) -> bool:
    """Mint and write a secret unless it exists; True when it was created now."""
    if path.exists():
        return False
    write_secret(path, mint())
    return True

"""`gantry controlplane|scheduler|worker ARGS`: one service per process, main imported lazily.

The CLI is its own distribution (gantry-cli) and names the services' modules only here, as
strings imported when a command needs one: it installs and runs without them, and a missing
service is one line naming it, not an ImportError at start-up.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import signal
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from gantry.cli.errors import CliError

ROLES: dict[str, str] = {
    "controlplane": "gantry.controlplane.main",
    "scheduler": "gantry.scheduler.main",
    "worker": "gantry.worker.main",
}
ROLE_HELP: dict[str, str] = {
    "controlplane": "run the control plane (--listen, --database-url, --scheduler, ...)",
    "scheduler": "run the scheduler (--listen, --service-token-file)",
    "worker": "run a worker agent (--control-plane, --credential-file, --artifact-root)",
}
# Set by `gantry up` on its children: a child whose supervisor died stops too.
SUPERVISOR_PID_ENV = "GANTRY_SUPERVISOR_PID"


# `gantry migrate` runs the control plane's own schema code (gantry.cli.migrate).
MIGRATE_MODULE = "gantry.controlplane.platform.database"


def load_service_module(role: str, module_name: str) -> ModuleType:
    """`module_name` of the `role` service, or a CliError saying that service is not installed."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only a missing service package is ours to explain; a missing dependency inside it
        # keeps its traceback, which lands in the role's log file.
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise CliError(f"the {role} service is not installed ({module_name})") from None
        raise


def _load_main(role: str) -> Callable[[list[str]], Any]:
    main: Callable[[list[str]], Any] = load_service_module(role, ROLES[role]).main
    return main


def _stop_when_orphaned(supervisor_pid: int, interval_s: float = 1.0) -> None:
    """SIGTERM ourselves once the supervisor is gone, so no service outlives `gantry up`.

    A polling thread rather than PR_SET_PDEATHSIG: that fires when the spawning *thread* exits,
    and the supervisor restarts children from its own polling thread.
    """

    def watch() -> None:
        while os.getppid() == supervisor_pid:
            threading.Event().wait(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="gantry-orphan-watch", daemon=True).start()


def run_role(role: str, argv: Sequence[str]) -> int:
    from setproctitle import setproctitle

    main = _load_main(role)
    setproctitle(f"gantry {role}")
    supervisor_pid = os.environ.get(SUPERVISOR_PID_ENV)
    if supervisor_pid and supervisor_pid.isdigit():
        _stop_when_orphaned(int(supervisor_pid))
    result = main(list(argv))
    if inspect.iscoroutine(result):
        result = asyncio.run(result)
    return int(result or 0)

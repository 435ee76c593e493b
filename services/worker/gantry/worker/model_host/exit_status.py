"""How a model host's end is told: in words for logs, and as UnloadEvidence that claims only
what was observed (an exit code only for an exit, the signal for a kill, neither if not gone)."""

from __future__ import annotations

import signal
from collections.abc import Sequence

from gantry.common.errors import GantryError
from gantry.v1 import worker_gateway_pb2


def describe_returncode(returncode: int | None) -> str:
    if returncode is None:
        return "no exit status"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def crashed_error(
    what: str,
    *,
    deployment_id: str,
    pid: int,
    returncode: int | None,
    output: Sequence[str],
    output_name: str,
) -> GantryError:
    """RUNTIME_CRASHED for a child of ours (a model host, a managed server) that exited on its
    own, with the last lines it wrote (`output_name`: where they came from)."""
    tail = "\n".join(list(output)[-10:])
    message = f"{what} {deployment_id!r} (pid {pid}) exited with {describe_returncode(returncode)}"
    return GantryError(
        "RUNTIME_CRASHED",
        f"{message}; {output_name} tail:\n{tail}" if tail else message,
        deployment_id=deployment_id,
        pid=str(pid),
    )


def exit_evidence(
    pid: int, returncode: int | None, *, exited: bool
) -> worker_gateway_pb2.UnloadEvidence:
    """What a stop can truthfully say: an exit code only for a process that exited by itself
    (returncode >= 0), the signal for one a signal ended, neither for one not confirmed gone."""
    evidence = worker_gateway_pb2.UnloadEvidence(pid=pid, process_exited=exited)
    if exited and returncode is not None:
        if returncode >= 0:
            evidence.has_exit_code = True
            evidence.exit_code = returncode
        else:
            evidence.exit_signal = -returncode
    return evidence

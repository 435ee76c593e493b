"""Per capability, the calls this control-plane replica answered since it started: successes and
failures with their summed durations, and when the last one was answered. Pure: the caller hands
in the time.

Fed from the one place every Inference call is answered with its capability and duration
(metrics.invocation_answered), so every door's calls (gantry.v1, KServe gRPC and REST, the
OpenAI API) count once; read by the KServe adapter's ModelStatistics. A call refused before its
capability resolved (a bad request, an unknown name) has no capability and is not tallied here
(gantry_invocations counts it, UNRESOLVED). Per replica and in memory: a restart starts at zero,
and a client behind several replicas sees the one that answered.
"""

from __future__ import annotations

from dataclasses import dataclass

# Capabilities are bindings, so their number is the operator's; the bound keeps a runaway
# deployment set from growing this without end. Past it a new capability is not tallied.
CAPABILITY_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class CapabilityCalls:
    success_count: int = 0
    success_ns: int = 0  # nanoseconds, summed over the successes
    fail_count: int = 0
    fail_ns: int = 0
    last_answered_ms: int = 0  # milliseconds since the epoch; 0: never


class CallTally:
    def __init__(self, limit: int = CAPABILITY_LIMIT) -> None:
        self._limit = limit
        self._calls: dict[str, CapabilityCalls] = {}

    def record(self, capability: str, *, ok: bool, seconds: float, now_ms: int) -> None:
        """One call of `capability` answered, OK or not, after `seconds`, at `now_ms`."""
        calls = self._calls.get(capability)
        if calls is None:
            if len(self._calls) >= self._limit:
                return
            calls = CapabilityCalls()
        ns = max(0, round(seconds * 1e9))
        # One object built directly, not two dataclasses.replace (5.7 -> ~1 us: every call).
        self._calls[capability] = CapabilityCalls(
            success_count=calls.success_count + ok,
            success_ns=calls.success_ns + (ns if ok else 0),
            fail_count=calls.fail_count + (not ok),
            fail_ns=calls.fail_ns + (0 if ok else ns),
            last_answered_ms=max(calls.last_answered_ms, now_ms),
        )

    def of(self, capability: str) -> CapabilityCalls:
        """The capability's tally; zeros for one not called (yet) on this replica."""
        return self._calls.get(capability, CapabilityCalls())

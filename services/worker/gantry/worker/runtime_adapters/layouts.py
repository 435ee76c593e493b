"""Which inspected layouts an adapter runs, as data: one matcher for every adapter.

Each model-host and managed-server adapter states its layout as a `LayoutMatch` (the inspector,
the task, the model type and any details that must hold, with the refusal each one says), and
`ModelHostRuntime.inspect_support` answers from it (a managed server kind inherits it). The
checks run in a fixed order, so a refusal names the first thing that does not fit: the
inspector, then the task and model type, then each detail in turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.runtime_adapters.base import Support


@dataclass(frozen=True, kw_only=True)
class DetailRule:
    """One inspection detail that must hold one of `accepted`, and the refusal when it does not:
    `refusal` with `{value}` standing for the value read ('?' when there is none)."""

    key: str
    accepted: tuple[str, ...]
    refusal: str


@dataclass(frozen=True, kw_only=True)
class LayoutMatch:
    """The layout one adapter runs, as static inspection names it."""

    inspector: str  # "transformers", "sentence_transformers"
    task: str  # as inspection names it
    runs: str  # what the adapter runs, as a refusal says it: "runs <runs>, not ..."
    model_type: str = ""  # empty: any model type of the task
    # A transformers refusal names the model type it found; a sentence-transformers layout has
    # none worth naming, so its refusal names the task alone.
    names_model_type: bool = True
    details: tuple[DetailRule, ...] = ()
    # Other names inspection gives the same task ("text-generation" beside "generation").
    task_aliases: tuple[str, ...] = ()
    verb: str = "runs"  # as a refusal says it: a managed server "serves"

    def support(self, adapter: str, inspection: wg.Inspection) -> Support:
        """Whether `inspection` is this layout, and the first reason when it is not. Pure."""
        refusal = self.refusal(inspection)
        if refusal:
            return Support(adapter=adapter, supported=False, reason=refusal)
        return Support(adapter=adapter, supported=True)

    def refusal(self, inspection: wg.Inspection) -> str:
        """Why `inspection` is not this layout; empty when it is."""
        if inspection.inspector != self.inspector:
            layouts = self.inspector.replace("_", "-")
            return f"{self.verb} {layouts} layouts, not {inspection.inspector}"
        wrong_type = bool(self.model_type) and inspection.model_type != self.model_type
        wrong_task = inspection.task not in (self.task, *self.task_aliases)
        if wrong_type or wrong_task:
            task = inspection.task or "an unknown task"
            if not self.names_model_type:
                return f"{self.verb} {self.runs}, not {task}"
            return f"{self.verb} {self.runs}, not {inspection.model_type or '?'} ({task})"
        for rule in self.details:
            value = inspection.details.get(rule.key, "")
            if value not in rule.accepted:
                return rule.refusal.format(value=value or "?")
        return ""

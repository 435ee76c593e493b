"""Pick the inspector from the file listing and finish its draft into an Inspection.

The dispatcher adds what holds whatever the layout: the weight format, the static artifact
gate's refusals as findings (executable code, `auto_map`, foreign module or activation classes,
module paths out of the set, a `*.safetensors` file that is not one;
`gantry.common.artifact_gate`, the same rules a load enforces), and which adapters can run it in
the inspected environment: each registered runtime adapter's `inspect_support` says whether it
runs the layout, the environment's facts whether it can be imported there. An Inspection is
executable only when an adapter runs its layout, the environment can import that adapter, and no
finding refuses it. An environment that runs no adapter of the layout's input at all (no image
adapter without torchvision) gets a note naming the modality it lacks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from gantry.common.artifact_gate import check_contents, check_path_name
from gantry.common.errors import GantryError
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.inspection import (
    custom_runner,
    diffusers,
    gguf,
    sentence_transformers,
    transformers,
)
from gantry.worker.inspection.artifact_files import (
    ENVIRONMENT_UNAVAILABLE,
    INCOMPATIBLE,
    NOTE,
    ArtifactFiles,
    Draft,
    finding,
)
from gantry.worker.inspection.weights import weight_format
from gantry.worker.runtime_adapters.registry import registered_adapters

Inspector = Callable[[ArtifactFiles], Draft]
# A draft's details key naming, comma-joined, the adapters that would serve its layout.
CANDIDATE_ADAPTERS = "candidate_adapters"


def choose_inspector(files: ArtifactFiles) -> Inspector:
    """Most specific layout first: a GGUF file or a Diffusers index decides whatever else is
    there; a declared custom runner wins over the config files it may also hold."""
    if files.ending(".gguf"):
        return gguf.inspect
    if files.has(diffusers.MODEL_INDEX):
        return diffusers.inspect
    if files.has(custom_runner.RUNNER_MANIFEST):
        return custom_runner.inspect
    if sentence_transformers.recognises(files):
        return sentence_transformers.inspect
    if files.has(transformers.CONFIG):
        return transformers.inspect
    return custom_runner.unrecognised


def gate_findings(files: ArtifactFiles) -> list[wg.InspectionFinding]:
    """Every refusal of the static gate, one finding per file (pickle is the weights' concern)."""
    found = []
    for path in files.paths():
        try:
            check_path_name(path, allow_pickle=True)
            check_contents([path], files.read, allow_pickle=True)
        except GantryError as error:
            found.append(finding(error.reason, error.message, path))
    return found


def inspect_artifact(
    files: ArtifactFiles, *, environment_id: str, environment_adapters: Collection[str]
) -> wg.Inspection:
    draft = choose_inspector(files)(files)
    findings = list(draft.findings)
    weights, weight_findings = weight_format(files)
    findings += weight_findings
    findings += gate_findings(files)
    inspection = wg.Inspection(
        inspector=draft.inspector,
        model_type=draft.model_type,
        modalities=draft.modalities,
        task=draft.task,
        weight_format=weights,
        details=draft.details,
    )
    supporting = [
        adapter.name
        for adapter in registered_adapters()
        if adapter.inspect_support(inspection).supported
    ]
    if not supporting:
        findings.append(finding(INCOMPATIBLE, _no_adapter_message(draft, weights), draft.key_path))
    # Every reason refuses but a note's: the gate's ARTIFACT_PATH_INVALID (a module path out of
    # the set) as much as RUNTIME_INCOMPATIBLE.
    refused = any(f.reason not in (NOTE, ENVIRONMENT_UNAVAILABLE) for f in findings)
    adapters: list[str] = []
    if not refused:
        for adapter in supporting:
            if adapter in environment_adapters:
                adapters.append(adapter)
            else:
                findings.append(
                    finding(
                        ENVIRONMENT_UNAVAILABLE,
                        f"adapter {adapter!r} cannot be imported in runtime environment "
                        f"{environment_id!r}",
                        draft.key_path,
                    )
                )
                findings.extend(_modality_notes(adapter, environment_id, environment_adapters))
    inspection.adapters.extend(adapters)
    inspection.executable = bool(adapters)
    inspection.findings.extend(findings)
    return inspection


def _no_adapter_message(draft: Draft, weights: str) -> str:
    """Why nothing runs the layout; a draft that names the adapters that would serve it
    (details["candidate_adapters"]) gets them said, with what was found, so the refusal tells
    which runtime to add rather than only no."""
    message = f"assessed but no adapter executes {draft.inspector} in this issue"
    registered = {adapter.name for adapter in registered_adapters()}
    candidates = [
        name
        for name in draft.details.get(CANDIDATE_ADAPTERS, "").split(",")
        if name and name not in registered
    ]
    if not candidates:
        return message
    found = " ".join(part for part in (draft.model_type, draft.task) if part)
    quantization = draft.details.get("quantization")
    stored = f"{weights or 'unknown'}{f' ({quantization})' if quantization else ''}"
    return (
        f"{message}: a {found} model with {stored} weights, which "
        f"{' or '.join(map(repr, candidates))} would serve; this worker does not run "
        f"{'it' if len(candidates) == 1 else 'them'}"
    )


def _modality_notes(
    adapter: str, environment_id: str, environment_adapters: Collection[str]
) -> list[wg.InspectionFinding]:
    """Why an environment lacks an adapter, when it lacks the adapter's whole modality: it runs
    nothing that takes that input (an environment without torchvision runs no image adapter),
    so the model must be assessed in another environment, not just with another adapter."""
    registered = {runtime.name: runtime for runtime in registered_adapters()}
    offered = sorted(
        {
            m
            for name in environment_adapters
            if name in registered
            for m in registered[name].modalities
        }
    )
    needed = registered[adapter].modalities
    return [
        finding(
            NOTE,
            f"runtime environment {environment_id!r} runs no adapter that takes {modality} "
            f"input (its adapters take {', '.join(offered) or 'nothing'}); {adapter!r} takes "
            f"{modality}: assess it in an environment that offers {modality} (its environment_id)",
        )
        for modality in needed
        if modality not in offered
    ]

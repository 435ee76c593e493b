"""Custom runners: an artifact set that declares its own runner in `gantry_runner.json`.

A minimal manifest, `{"runner": "<name>", "task": "...", "modalities": ["text"]}`, lets an
operator say what a layout Gantry does not know is. No runner outside Gantry's adapters executes
in this issue, so such a set is assessed (its declaration reported) and refused.
"""

from __future__ import annotations

from gantry.worker.inspection.artifact_files import INCOMPATIBLE, ArtifactFiles, Draft, finding

RUNNER_MANIFEST = "gantry_runner.json"


def inspect(files: ArtifactFiles) -> Draft:
    draft = Draft(inspector="custom", key_path=RUNNER_MANIFEST)
    manifest = files.json_object(RUNNER_MANIFEST, draft.findings)
    runner = manifest.get("runner")
    if not isinstance(runner, str) or not runner:
        draft.findings.append(
            finding(INCOMPATIBLE, f"{RUNNER_MANIFEST} names no runner", RUNNER_MANIFEST)
        )
    draft.model_type = runner if isinstance(runner, str) else ""
    draft.details["runner"] = draft.model_type
    if isinstance(manifest.get("task"), str):
        draft.task = manifest["task"]
    modalities = manifest.get("modalities")
    if isinstance(modalities, list):
        draft.modalities = sorted({m for m in modalities if isinstance(m, str)})
    return draft


def unrecognised(files: ArtifactFiles) -> Draft:
    """No inspector knows this layout: say what was looked for."""
    draft = Draft(inspector="unrecognised", key_path="")
    draft.findings.append(
        finding(
            INCOMPATIBLE,
            "no inspector recognises this layout (looked for *.gguf, model_index.json, "
            f"{RUNNER_MANIFEST}, modules.json, config_sentence_transformers.json, config.json)",
        )
    )
    return draft

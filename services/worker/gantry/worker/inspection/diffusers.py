"""Diffusers pipelines (model_index.json): the pipeline class and its components."""

from __future__ import annotations

from gantry.worker.inspection.artifact_files import INCOMPATIBLE, ArtifactFiles, Draft, finding

MODEL_INDEX = "model_index.json"
# Libraries a component may name; any other is custom code the pipeline would import.
_KNOWN_LIBRARIES = frozenset({"diffusers", "transformers"})


def task_of(pipeline_class: str) -> str:
    for marker, task in (
        ("Img2Img", "image-to-image"),
        ("Inpaint", "inpainting"),
        ("Video", "video-generation"),
        ("Audio", "audio-generation"),
        ("Upscale", "image-upscaling"),
    ):
        if marker in pipeline_class:
            return task
    return "text-to-image"


def inspect(files: ArtifactFiles) -> Draft:
    draft = Draft(inspector="diffusers", key_path=MODEL_INDEX, modalities=["image", "text"])
    index = files.json_object(MODEL_INDEX, draft.findings)
    pipeline_class = str(index.get("_class_name") or "")
    draft.model_type = pipeline_class
    draft.task = task_of(pipeline_class) if pipeline_class else ""
    if isinstance(index.get("_diffusers_version"), str):
        draft.details["diffusers_version"] = index["_diffusers_version"]
    components = []
    for name, value in sorted(index.items()):
        if name.startswith("_") or not isinstance(value, list) or len(value) != 2:
            continue
        library, class_name = value
        if library is None or class_name is None:
            continue  # an optional component left out
        components.append(f"{name}:{class_name}")
        if library not in _KNOWN_LIBRARIES:
            draft.findings.append(
                finding(
                    INCOMPATIBLE,
                    f"component {name!r} names class {class_name!r} from library {library!r}: "
                    "custom code the pipeline would import",
                    MODEL_INDEX,
                )
            )
    if components:
        draft.details["components"] = ",".join(components)
    return draft

"""The weight format of an artifact set, from file names and what the bytes are (pickle magic, a
torch.save zip, a real safetensors header: `gantry.common.artifact_gate.judge_weight_bytes`)."""

from __future__ import annotations

from gantry.common.artifact_gate import PICKLE_SUFFIXES, judge_weight_bytes
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.inspection.artifact_files import NOTE, ArtifactFiles, finding

# Suffix -> format, in the order a loader would prefer them.
_FORMATS = (
    (".safetensors", "safetensors"),
    (".gguf", "gguf"),
    (".onnx", "onnx"),
    (".h5", "h5"),
    (".msgpack", "flax"),
    (".tflite", "tflite"),
)


def pickle_files(files: ArtifactFiles) -> list[str]:
    """Files that unpickle when loaded: by name, or by their bytes whatever their name (pickle
    magic, or a zip archive as torch.save writes one, a `model.safetensors` included)."""
    return [
        path
        for path in files.paths()
        if path.lower().endswith(PICKLE_SUFFIXES)
        or judge_weight_bytes(path, files.read).pickled is not None
    ]


def weight_format(files: ArtifactFiles) -> tuple[str, list[wg.InspectionFinding]]:
    """ "pickle" whenever any pickle file is present (that is what a profile must allow), else the
    first format found; a note explains the pickle files, since unpickling runs code."""
    pickled = pickle_files(files)
    if pickled:
        more = f" (+{len(pickled) - 5} more)" if len(pickled) > 5 else ""
        shown = ", ".join(pickled[:5]) + more
        return "pickle", [
            finding(
                NOTE,
                f"pickle-format weights ({shown}): unpickling runs code, so they load only "
                "under a runtime profile that allows pickle weights (allow_pickle_weights)",
                pickled[0],
            )
        ]
    for suffix, name in _FORMATS:
        if files.ending(suffix):
            return name, []
    return "", [finding(NOTE, "no weight file of a known format was found")]

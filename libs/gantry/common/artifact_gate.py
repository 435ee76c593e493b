"""The static artifact gate: what no artifact set may hold, whichever runtime would load it.

Refused before any load, and before registration where the caller can see it: executable code
(by name or by executable bit), `auto_map`/`auto_mapping` (remote-code hooks) in any config file,
sentence-transformers module classes outside an allow-list, module paths (modules.json, a Router's
routes) that leave the artifact set, activation classes outside `torch.nn`, pickle weights unless
`allow_pickle` (by extension, or by their bytes whatever the name: pickle magic, or a zip archive,
which is how `torch.save` writes a pickle), a `*.safetensors` name over bytes that are not
safetensors, and every entry that is not a plain file or directory (symlinks, fifos, devices,
sockets) or whose name holds a control character or a backslash.

The rules are pure: they look at a listing (path and `lstat` mode) and at the bytes a `read`
callable hands them. They import no ML library and never execute what they inspect; the directory
walk that feeds them lives with the manifest code (`gantry.common.artifact_walk.gate_directory`).
"""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gantry.common.errors import GantryError

# What may appear as a `type` in modules.json (or in a Router's `types`): first-party
# sentence-transformers modules only, in the spellings 2.x-6.x write and load. Anything else is a
# class that `import_module_class` would import for us: code selected by the artifact.
_LEGACY_MODULES = (
    "Transformer",
    "Pooling",
    "Normalize",
    "Dense",
    "Dropout",
    "LayerNorm",
    "WeightedLayerPooling",
    "StaticEmbedding",
    "Router",
    "Asym",
    "CLIPModel",
)
ALLOWED_MODULE_CLASSES: frozenset[str] = frozenset(
    [f"sentence_transformers.models.{name}" for name in _LEGACY_MODULES]
    + [f"sentence_transformers.sentence_transformer.modules.{name}" for name in _LEGACY_MODULES]
    + [
        f"sentence_transformers.base.modules.{name}"
        for name in ("Transformer", "Normalize", "Dense", "Router", "Asym")
    ]
    + [
        # Fully qualified, as sentence-transformers 6 saves them (module path + class name).
        "sentence_transformers.base.modules.transformer.Transformer",
        "sentence_transformers.base.modules.normalize.Normalize",
        "sentence_transformers.base.modules.dense.Dense",
        "sentence_transformers.base.modules.router.Router",
        "sentence_transformers.base.modules.router.Asym",
        "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
        "sentence_transformers.sentence_transformer.modules.dropout.Dropout",
        "sentence_transformers.sentence_transformer.modules.layer_norm.LayerNorm",
        "sentence_transformers.sentence_transformer.modules.weighted_layer_pooling"
        ".WeightedLayerPooling",
        "sentence_transformers.sentence_transformer.modules.static_embedding.StaticEmbedding",
        "sentence_transformers.sentence_transformer.modules.clip_model.CLIPModel",
        # The 3.x-5.x module paths.
        "sentence_transformers.models.Transformer.Transformer",
        "sentence_transformers.models.Pooling.Pooling",
        "sentence_transformers.models.Normalize.Normalize",
        "sentence_transformers.models.Dense.Dense",
        "sentence_transformers.models.Dropout.Dropout",
        "sentence_transformers.models.LayerNorm.LayerNorm",
    ]
)

# Dense/CrossEncoder configs name an activation class that is imported and instantiated.
_ALLOWED_ACTIVATION = re.compile(r"^torch\.nn\.(modules\.(activation|linear)\.)?[A-Z][A-Za-z0-9]*$")
_ACTIVATION_KEYS = frozenset({"activation_function", "activation_fn"})
# Keys that make transformers/peft import a class named by the artifact (remote code).
_REMOTE_CODE_KEYS = frozenset({"auto_map", "auto_mapping"})

EXECUTABLE_SUFFIXES = (
    ".py",
    ".pyc",
    ".pyo",
    ".pyd",
    ".so",
    ".dylib",
    ".dll",
    ".exe",
    ".sh",
    ".bash",
    ".bat",
    ".cmd",
    ".ps1",
)
_VERSIONED_SHARED_OBJECT = re.compile(r"\.so(\.\d+)+$")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib")
_PICKLE_PROTOCOLS = range(2, 6)  # protocol 2+ opens with PROTO (0x80) and the protocol number
# A zip's local file header. `torch.save` has written zip archives (data.pkl inside) since torch
# 1.6, and `torch.load` opens one by its bytes whatever the file is called.
ZIP_MAGIC = b"PK\x03\x04"
MAX_CONFIG_BYTES = 16 * 1024 * 1024
HEAD_BYTES = 16
SAFETENSORS_SUFFIX = ".safetensors"
_SAFETENSORS_LENGTH_BYTES = 8  # a little-endian u64: how many bytes of JSON header follow
_SAFETENSORS_MIN_HEADER = 2  # "{}"

ReadFile = Callable[[str, int], bytes]  # (relative path, at most this many bytes) -> bytes


@dataclass(frozen=True, slots=True)
class ListedEntry:
    """One entry of an artifact directory: its relative '/'-path and its mode (never followed)."""

    path: str
    mode: int


def shown(path: str) -> str:
    """The path as it may be printed on one line: escaped when it holds a control character."""
    return path if path.isprintable() else ascii(path)[1:-1]


def _incompatible(path: str, why: str) -> GantryError:
    return GantryError("RUNTIME_INCOMPATIBLE", f"artifact file {path!r} {why}", file=shown(path))


def _path_invalid(path: str, why: str) -> GantryError:
    return GantryError("ARTIFACT_PATH_INVALID", f"{path!r} {why}", file=shown(path))


# A copy of a Hugging Face hub cache (`snapshots/<rev>/*` link into `blobs/`) is the usual way a
# symlink gets into an artifact set. Links stay refused (one could point anywhere on the worker's
# host, and the verified bytes must be the set's own); the message says how to make the files real.
SYMLINK_HINT = (
    "is a symlink (a copy of a hub cache?); artifact sets hold plain files only: copy the model"
    " with `cp -rL SOURCE DEST` so the files are real"
)


def unsafe_character(path: str) -> str | None:
    """What makes a path unprintable or ambiguous (a control character, backslash), else None."""
    for char in path:
        if ord(char) < 0x20 or ord(char) == 0x7F:
            return f"control character {char!a}"
        if char == "\\":
            return "backslash"
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "name that is not valid UTF-8"
    return None


def check_path_name(path: str, *, allow_pickle: bool = False) -> None:
    """The rules a path alone decides: characters, executable and pickle names."""
    unsafe = unsafe_character(path)
    if unsafe is not None:
        raise _path_invalid(path, f"holds a {unsafe}")
    name = path.rsplit("/", 1)[-1].lower()
    if name.endswith(EXECUTABLE_SUFFIXES) or _VERSIONED_SHARED_OBJECT.search(name):
        raise _incompatible(path, "is executable code; artifact sets hold data only")
    if not allow_pickle and name.endswith(PICKLE_SUFFIXES):
        raise _incompatible(
            path, "is a pickle-format weight file (unpickling runs code); use safetensors"
        )


def gate_manifest_paths(paths: Iterable[str], *, allow_pickle: bool = False) -> None:
    """What a registration can check without the bytes: every path by name (sorted order)."""
    for path in sorted(paths):
        check_path_name(path, allow_pickle=allow_pickle)


def check_entry_kind(entry: ListedEntry) -> None:
    """Only plain files and directories with printable names (ARTIFACT_PATH_INVALID otherwise)."""
    if stat.S_ISLNK(entry.mode):
        raise _path_invalid(entry.path, SYMLINK_HINT)
    if not (stat.S_ISREG(entry.mode) or stat.S_ISDIR(entry.mode)):
        raise _path_invalid(entry.path, "is not a regular file or directory")
    unsafe = unsafe_character(entry.path)
    if unsafe is not None:
        raise _path_invalid(entry.path, f"holds a {unsafe}")


def check_listing(entries: Iterable[ListedEntry], *, allow_pickle: bool = False) -> None:
    """Kinds, executable bits and names of a directory's entries (sorted order)."""
    for entry in sorted(entries, key=lambda e: e.path):
        check_entry_kind(entry)
        if stat.S_ISDIR(entry.mode):
            continue
        check_path_name(entry.path, allow_pickle=allow_pickle)
        if entry.mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH):
            raise _incompatible(entry.path, "has an executable bit set")


def _is_config_json(name: str) -> bool:
    return name == "modules.json" or (name.endswith(".json") and "config" in name)


def safetensors_header_length(head: bytes) -> int | None:
    """The header length the first 8 bytes of a safetensors file claim; None when shorter."""
    if len(head) < _SAFETENSORS_LENGTH_BYTES:
        return None
    return int.from_bytes(head[:_SAFETENSORS_LENGTH_BYTES], "little")


def safetensors_problem(head: bytes, header: bytes) -> str | None:
    """Why a file is not safetensors, from its first bytes (`head`) and the bytes after its length
    prefix as read (`header`: at most the claimed length of them); None when it is one.

    The bounds come first, so the caller reads a header only when its claimed length is sane:
    2 bytes ("{}") to `MAX_CONFIG_BYTES` (what inspection reads), all of them present, UTF-8 JSON
    making one object, as the safetensors loader itself requires."""
    length = safetensors_header_length(head)
    if length is None:
        return f"is {len(head)} bytes, shorter than a safetensors length prefix"
    if not _SAFETENSORS_MIN_HEADER <= length <= MAX_CONFIG_BYTES:
        return (
            f"claims a {length}-byte safetensors header (a sane one is "
            f"{_SAFETENSORS_MIN_HEADER} to {MAX_CONFIG_BYTES} bytes)"
        )
    if len(header) < length:
        return f"claims a {length}-byte safetensors header but only {len(header)} bytes follow"
    try:
        document = json.loads(header[:length].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "has a safetensors header that is not UTF-8 JSON"
    if not isinstance(document, dict):
        return "has a safetensors header that is not a JSON object"
    return None


def pickle_content(head: bytes, *, safetensors: bool) -> str | None:
    """Why bytes opening with `head` are a pickle checkpoint, whatever the file is called; None
    when they are not. `safetensors`: the whole file parsed as safetensors, whose length prefix
    may well open with 0x80 0x02-0x05 (pickle magic at a glance) but never unpickles."""
    if head.startswith(ZIP_MAGIC):
        return "is a zip archive, the format torch.save writes a pickle in"
    if len(head) >= 2 and head[0] == 0x80 and head[1] in _PICKLE_PROTOCOLS and not safetensors:
        return "starts with pickle magic"
    return None


@dataclass(frozen=True, slots=True)
class WeightBytes:
    """What a file's bytes are, whatever its name says."""

    pickled: str | None  # why the file unpickles when loaded (refused unless pickle is allowed)
    not_safetensors: str | None  # a *.safetensors name over other bytes: why (always refused)


def judge_weight_bytes(path: str, read: ReadFile) -> WeightBytes:
    """Read the head of `path` (and, for a *.safetensors name, its header when the claimed length
    is sane) and judge the bytes: only a file named *.safetensors is loaded by the safetensors
    loader, so only that name, over a real safetensors header, excuses pickle magic."""
    head = read(path, HEAD_BYTES)
    if not path.lower().endswith(SAFETENSORS_SUFFIX):
        return WeightBytes(pickled=pickle_content(head, safetensors=False), not_safetensors=None)
    length = safetensors_header_length(head)
    header = b""
    if length is not None and _SAFETENSORS_MIN_HEADER <= length <= MAX_CONFIG_BYTES:
        header = read(path, _SAFETENSORS_LENGTH_BYTES + length)[_SAFETENSORS_LENGTH_BYTES:]
    problem = safetensors_problem(head, header)
    return WeightBytes(
        pickled=pickle_content(head, safetensors=problem is None), not_safetensors=problem
    )


def check_contents(paths: Sequence[str], read: ReadFile, *, allow_pickle: bool = False) -> None:
    """Weight bytes (pickle and zip magic, fake safetensors) and config files (remote-code hooks,
    module classes and paths, activation classes)."""
    for path in sorted(paths):
        name = path.rsplit("/", 1)[-1].lower()
        weights = judge_weight_bytes(path, read)
        if weights.pickled is not None and not allow_pickle:
            raise _incompatible(path, f"{weights.pickled} (unpickling runs code)")
        if weights.not_safetensors is not None:
            why = weights.pickled or weights.not_safetensors
            raise _incompatible(path, f"is named {SAFETENSORS_SUFFIX} but {why}")
        if _is_config_json(name):
            _check_config(path, read(path, MAX_CONFIG_BYTES + 1), is_modules=name == "modules.json")


def gate_artifact(
    entries: Sequence[ListedEntry], read: ReadFile, *, allow_pickle: bool = False
) -> None:
    """The whole gate over one artifact directory: listing first, then contents."""
    check_listing(entries, allow_pickle=allow_pickle)
    files = [e.path for e in entries if stat.S_ISREG(e.mode)]
    check_contents(files, read, allow_pickle=allow_pickle)


def _check_config(path: str, raw: bytes, *, is_modules: bool) -> None:
    if len(raw) > MAX_CONFIG_BYTES:
        raise _incompatible(path, f"is larger than {MAX_CONFIG_BYTES} bytes; too large to inspect")
    try:
        text = raw.decode("utf-8")
        # Every key of every object, duplicates included: a parser that keeps the last of two
        # `auto_map`s must not hide the first from us.
        document = json.loads(text, object_pairs_hook=lambda pairs: _checked_object(path, pairs))
    except (UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, _Refused):
            raise exc.error from None
        raise _incompatible(path, f"is not valid UTF-8 JSON ({exc}); cannot inspect it") from None
    if is_modules:
        _check_modules(path, document)
    elif isinstance(document, dict):
        _check_router_types(path, document)


class _Refused(ValueError):
    """Carries a gate refusal out of json's object hook (which only lets ValueError through)."""

    def __init__(self, error: GantryError) -> None:
        super().__init__(error.message)
        self.error = error


def _checked_object(path: str, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    for key, value in pairs:
        if key in _REMOTE_CODE_KEYS:
            raise _Refused(
                _incompatible(path, f"declares {key!r} (custom code the runtime would import)")
            )
        if key in _ACTIVATION_KEYS and isinstance(value, str) and "." in value:
            if not _ALLOWED_ACTIVATION.match(value):
                raise _Refused(
                    _incompatible(path, f"names activation class {value!r} outside torch.nn")
                )
    return dict(pairs)


_DRIVE = re.compile(r"^[A-Za-z]:")  # "C:..." roots a path on Windows


def module_path_problem(module_path: object) -> str | None:
    """Why a module's directory, as modules.json (`path`) or a Router's config (a `types` key)
    names it, would leave the artifact set; None when it stays inside. sentence-transformers joins
    it to the model directory and loads what it finds there, so it must be relative: "" (the set
    itself) or '/'-separated names, none of them '..', without a leading '/', a drive or a
    backslash (how Windows roots or climbs), a control character or a NUL. A name that is a
    symlink is the listing's to refuse: an artifact set holds no links."""
    if not isinstance(module_path, str):
        return "is not a string"
    unsafe = unsafe_character(module_path)
    if unsafe is not None:
        return f"holds a {unsafe}"
    if module_path.startswith("/") or _DRIVE.match(module_path):
        return "is absolute"
    if ".." in module_path.split("/"):
        return "climbs out with '..'"
    return None


def _check_module_path(path: str, module_path: object) -> None:
    problem = module_path_problem(module_path)
    if problem is not None:
        raise GantryError(
            "ARTIFACT_PATH_INVALID",
            f"artifact file {path!r} names module path {module_path!r}, which {problem}; a "
            "module's directory must be inside the artifact set",
            file=shown(path),
            module_path=shown(str(module_path))[:256],
        )


def _check_modules(path: str, document: object) -> None:
    if not isinstance(document, list):
        raise _incompatible(path, "is not a list of modules")
    for module in document:
        _check_module_class(path, module.get("type") if isinstance(module, dict) else None)
        _check_module_path(path, module.get("path") if isinstance(module, dict) else None)


def _check_router_types(path: str, document: dict[str, Any]) -> None:
    # A Router's config maps route names to module classes it imports, like modules.json does;
    # each route's name is also the directory, under the Router's own, that its module loads from.
    types = document.get("types")
    if not (isinstance(types, dict) and "structure" in document):
        return
    for route, module_type in types.items():
        _check_module_class(path, module_type)
        _check_module_path(path, route)


def _check_module_class(path: str, module_type: object) -> None:
    if not isinstance(module_type, str) or module_type not in ALLOWED_MODULE_CLASSES:
        raise _incompatible(
            path, f"names module class {module_type!r}, not an allowed sentence-transformers one"
        )

"""What a model host saw of itself, for its offline evidence: the weight files it opened or mapped,
and code it imported from where a model's own code would come from.

Observed, not declared: the adapter's `local_files_only` and `trust_remote_code` say what it asks
of the library; these say what happened in the process. Three sources see the weight files, as
none sees them all: inotify sees every open of a file in the verified copy, by any code
(`copy_watch`, started by `install` before the load); a Python audit hook sees every `open` made
through Python, wherever the file is (torch.load's pickles, a hub cache); and /proc/self/maps
shows the files the process has mapped now (safetensors maps its files, from Rust, which no audit
hook sees). A weight file outside the copy opened by native code and no longer mapped is the one
case none of them sees; the sandbox (Landlock) is what keeps such reads out. The import roots are
`sys.path` as it stood when this module was imported, before any model was read: a module whose
file lies elsewhere (the model's directory, the hub's module cache under the host's private
HOME), or under `transformers_modules` (the package transformers imports a trusted model's code
as), is reported as remote code.

The classification is pure (`classify_weight_files`, `remote_code_modules`); `observe` reads.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from gantry.worker.model_host.copy_watch import CopyWatch

# What a model's weights are stored as (safetensors, torch pickles, GGUF, ONNX, Keras, Flax).
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".pkl",
    ".pickle",
    ".gguf",
    ".onnx",
    ".h5",
    ".msgpack",
    ".npz",
)
REMOTE_CODE_PACKAGE = "transformers_modules"
# Entries of each list in the evidence, and paths the hook keeps: far above a real model's.
MAX_REPORTED = 256
MAX_WATCHED = 4096
MAPS = "/proc/self/maps"


def import_roots(path: Iterable[str], modules: Mapping[str, ModuleType | None]) -> tuple[str, ...]:
    """Where the interpreter imports from: `path`'s directories, and the directories of the
    top-level packages already imported (an editable install's, found by its finder, are on no
    path entry)."""
    entries = list(path)
    for name, module in modules.items():
        if "." not in name:
            entries.extend(getattr(module, "__path__", ()))
    return tuple(dict.fromkeys(os.path.normpath(e) for e in entries if os.path.isabs(e)))


# As they stand when this module is imported: in a model host, before any model is read.
_IMPORT_ROOTS = import_roots(sys.path, dict(sys.modules))


@dataclass(frozen=True, kw_only=True)
class Observation:
    remote_code_modules: list[str]
    weight_files: list[str]  # under the verified copy, relative to it
    weight_files_outside_copy: list[str]  # absolute
    opens_observed: bool


def is_weight_file(path: str) -> bool:
    return path.lower().endswith(WEIGHT_SUFFIXES)


class _OpenWatch:
    """The weight files this process opened through Python since `install`."""

    def __init__(self) -> None:
        self.installed = False
        self._lock = threading.Lock()
        self._paths: set[str] = set()

    def install(self) -> None:
        # An audit hook cannot be removed: one per process, kept for its life.
        if not self.installed:
            sys.addaudithook(self._hook)
            self.installed = True

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        # Called for every audited event in the process: the cheap test first.
        if event != "open" or not args:
            return
        path = args[0]
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if isinstance(path, str) and is_weight_file(path) and len(self._paths) < MAX_WATCHED:
            with self._lock:
                self._paths.add(os.path.abspath(path))

    def paths(self) -> set[str]:
        with self._lock:
            return set(self._paths)


_WATCH = _OpenWatch()
_COPY = CopyWatch()


def install(copy: Path) -> None:
    """Start watching this process's opens (Python's, and any of the copy's files); before the
    model is read, so its reads are seen. Once per process: a host loads one model."""
    _WATCH.install()
    if not _COPY.watching:
        _COPY.start(copy)


def mapped_files(maps_text: str) -> set[str]:
    """The files named in a /proc/<pid>/maps text (its sixth column, an absolute path)."""
    files: set[str] = set()
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            files.add(fields[5].removesuffix(" (deleted)"))
    return files


def classify_weight_files(paths: Iterable[str], copy: Path) -> tuple[list[str], list[str]]:
    """(under the verified copy, relative to it; outside it, absolute): weight files only."""
    inside: set[str] = set()
    outside: set[str] = set()
    root = os.path.normpath(copy)
    for path in paths:
        normal = os.path.normpath(path)
        if not is_weight_file(normal):
            continue
        if normal.startswith(root + os.sep):
            inside.add(os.path.relpath(normal, root))
        else:
            outside.add(normal)
    return sorted(inside)[:MAX_REPORTED], sorted(outside)[:MAX_REPORTED]


def remote_code_modules(
    modules: Mapping[str, ModuleType | None], roots: Iterable[str] = _IMPORT_ROOTS
) -> list[str]:
    """Modules under `transformers_modules`, or whose file is outside every import root."""
    prefixes = tuple(root.rstrip(os.sep) + os.sep for root in roots)
    found = []
    for name, module in modules.items():
        if name == REMOTE_CODE_PACKAGE or name.startswith(REMOTE_CODE_PACKAGE + "."):
            found.append(name)
            continue
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and os.path.isabs(file):
            if not os.path.normpath(file).startswith(prefixes):
                found.append(name)
    return sorted(found)[:MAX_REPORTED]


def _read_maps() -> str:
    try:
        with open(MAPS, encoding="utf-8", errors="replace") as maps:
            return maps.read()
    except OSError:
        return ""


def observe(copy: Path) -> Observation:
    """What this process has done so far: its imports, and the weight files it opened (since
    `install`) or has mapped now."""
    seen = _WATCH.paths() | _COPY.drain() | mapped_files(_read_maps())
    inside, outside = classify_weight_files(seen, copy)
    return Observation(
        remote_code_modules=remote_code_modules(dict(sys.modules)),
        weight_files=inside,
        weight_files_outside_copy=outside,
        opens_observed=_WATCH.installed and _COPY.watching and not _COPY.overflowed,
    )

"""What a model host observes of itself for its offline evidence: the readings' pure parts, and
the copy watch on this kernel (a real child's whole evidence: test_model_host_cuda_oom.py)."""

from __future__ import annotations

import os
import struct
import types
from pathlib import Path

from gantry.worker.model_host import copy_watch, observed

MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:00 123  /usr/bin/python3.11
7fd43b5a0000-7fd43b5b8000 rw-p 00000000 fe:00 2146365                    /copy/model.safetensors
7fd43b600000-7fd43b700000 r--p 00000000 fe:00 999  /home/h/.cache/hub/pytorch_model.bin (deleted)
7fd43b800000-7fd43b900000 rw-p 00000000 00:00 0
7ffd1a1d2000-7ffd1a1f3000 rw-p 00000000 00:00 0                          [stack]
"""


def _module(name: str, file: str | None) -> types.ModuleType:
    module = types.ModuleType(name)
    if file is not None:
        module.__file__ = file
    return module


def test_mapped_files_are_the_paths_of_the_maps_text() -> None:
    assert observed.mapped_files(MAPS) == {
        "/usr/bin/python3.11",
        "/copy/model.safetensors",
        "/home/h/.cache/hub/pytorch_model.bin",
    }


def test_weight_files_are_split_by_whether_they_lie_in_the_copy() -> None:
    paths = [
        "/copy/model.safetensors",
        "/copy/2_Dense/pytorch_model.bin",
        "/copy/config.json",  # not weights
        "/copy-other/model.safetensors",  # a sibling whose name starts like the copy's
        "/home/h/.cache/hub/model.safetensors",
        "/usr/lib/libc.so.6",
    ]
    assert observed.classify_weight_files(paths, Path("/copy")) == (
        ["2_Dense/pytorch_model.bin", "model.safetensors"],
        ["/copy-other/model.safetensors", "/home/h/.cache/hub/model.safetensors"],
    )


def test_remote_code_is_what_lies_outside_the_import_roots_or_under_transformers_modules() -> None:
    roots = observed.import_roots(
        ["/venv/site-packages", "relative-entry", "__editable__.finder.__path_hook__"],
        {"gantry": types.SimpleNamespace(__path__=["/src/libs/gantry"])},  # type: ignore[dict-item]
    )
    assert roots == ("/venv/site-packages", "/src/libs/gantry")
    modules = {
        "torch": _module("torch", "/venv/site-packages/torch/__init__.py"),
        "gantry.common": _module("gantry.common", "/src/libs/gantry/common/__init__.py"),
        "sys": _module("sys", None),  # built in: no file
        "transformers_modules": _module("transformers_modules", None),
        "transformers_modules.m.modeling": _module("m", "/home/h/.cache/modules/m/modeling.py"),
        "modeling_evil": _module("modeling_evil", "/copy/modeling_evil.py"),
        "siteish": _module("siteish", "/venv/site-packages-extra/x.py"),
    }
    assert observed.remote_code_modules(modules, roots) == [
        "modeling_evil",
        "siteish",
        "transformers_modules",
        "transformers_modules.m.modeling",
    ]


def test_this_interpreters_own_modules_are_not_remote_code() -> None:
    import json

    assert observed.remote_code_modules({"json": json}) == []


def _event(wd: int, mask: int, name: bytes) -> bytes:
    padded = name + b"\0" * (-len(name) % 16 or 16) if name else b""
    return struct.pack("iIII", wd, mask, 0, len(padded)) + padded


def test_inotify_events_parse_to_the_paths_opened() -> None:
    buffer = (
        _event(1, copy_watch.IN_OPEN, b"model.safetensors")
        + _event(2, copy_watch.IN_OPEN, b"config.json")
        + _event(1, copy_watch.IN_OPEN | copy_watch.IN_ISDIR, b"")  # the directory itself
        + _event(1, copy_watch.IN_OPEN | copy_watch.IN_ISDIR, b"1_Pooling")  # a subdirectory
        + _event(9, copy_watch.IN_OPEN, b"unknown-watch")
    )
    directories = {1: "/copy", 2: "/copy/1_Pooling"}
    assert copy_watch.parse_events(buffer, directories) == (
        {"/copy/model.safetensors", "/copy/1_Pooling/config.json"},
        False,
    )
    overflow = _event(-1, copy_watch.IN_Q_OVERFLOW, b"")
    assert copy_watch.parse_events(overflow, directories) == (set(), True)


def test_the_copy_watch_sees_opens_by_this_kernel_in_nested_directories(tmp_path: Path) -> None:
    (tmp_path / "2_Dense").mkdir()
    weights = tmp_path / "2_Dense" / "model.safetensors"
    weights.write_bytes(b"\0")
    watch = copy_watch.CopyWatch()
    watch.start(tmp_path)
    assert watch.watching
    assert watch.drain() == set()  # nothing opened yet: the writes came before the watch
    fd = os.open(weights, os.O_RDONLY)  # a raw open, as native code makes it
    os.close(fd)
    assert watch.drain() == {str(weights)}
    assert not watch.overflowed

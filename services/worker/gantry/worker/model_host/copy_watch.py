"""The files of the verified artifact copy this process opened, whatever code opened them.

inotify (IN_OPEN on each directory of the copy) sees an open by native code as well as by Python:
safetensors and tokenizers open their files from Rust, where no audit hook sees them, and a model
on a CUDA device no longer maps its weight files once they are on the device. Watching is by
descriptor, so the process needs no access beyond what reading the copy already needs, and
nothing here blocks: events are read when they are drained. Linux only; elsewhere, or when the
kernel refuses, `watching` is False and the caller says so.
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
from pathlib import Path

logger = logging.getLogger("gantry.model_host")

IN_OPEN = 0x00000020
IN_Q_OVERFLOW = 0x00004000
IN_ISDIR = 0x40000000  # the event is a directory's (its listing), not a file's
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name
# Directories watched at most (a model's copy has a handful), and files remembered.
MAX_DIRECTORIES = 256
MAX_FILES = 4096


def parse_events(buffer: bytes, directories: dict[int, str]) -> tuple[set[str], bool]:
    """(files opened, whether the kernel's queue overflowed) from raw inotify events. Pure."""
    opened: set[str] = set()
    overflowed = False
    offset = 0
    while offset + _EVENT.size <= len(buffer):
        wd, mask, _, length = _EVENT.unpack_from(buffer, offset)
        name = buffer[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
        offset += _EVENT.size + length
        if mask & IN_Q_OVERFLOW:
            overflowed = True
        elif mask & IN_OPEN and not mask & IN_ISDIR and name and wd in directories:
            opened.add(os.path.join(directories[wd], os.fsdecode(name)))
    return opened, overflowed


class CopyWatch:
    """IN_OPEN watches on every directory of one copy, started before the model is read."""

    def __init__(self) -> None:
        self._fd = -1
        self._directories: dict[int, str] = {}
        self.opened: set[str] = set()
        self.overflowed = False

    @property
    def watching(self) -> bool:
        return self._fd >= 0

    def start(self, copy: Path) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                raise OSError(ctypes.get_errno(), "inotify_init1")
            for directory, _, _ in os.walk(copy):
                if len(self._directories) >= MAX_DIRECTORIES:
                    break
                wd = libc.inotify_add_watch(fd, os.fsencode(directory), IN_OPEN)
                if wd < 0:
                    os.close(fd)
                    raise OSError(ctypes.get_errno(), f"inotify_add_watch {directory}")
                self._directories[wd] = directory
        except (OSError, AttributeError) as exc:
            # Not Linux, or the kernel refused: opens by native code go unseen, and are said so.
            logger.warning("cannot watch the artifact copy's opens: %s", exc)
            self._directories.clear()
            return
        self._fd = fd

    def drain(self) -> set[str]:
        """Read the events queued since the last drain; every file seen opened so far."""
        while self._fd >= 0:
            try:
                buffer = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                break
            if not buffer:
                break
            opened, overflowed = parse_events(buffer, self._directories)
            self.overflowed |= overflowed
            room = MAX_FILES - len(self.opened)
            self.opened.update(sorted(opened)[: max(0, room)])
        return set(self.opened)

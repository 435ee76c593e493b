"""Landlock through raw syscalls: probe the ABI, build a ruleset, restrict the calling process.

Landlock is a stackable LSM an unprivileged process applies to itself (Linux >= 5.13). Everything
the ruleset *handles* is denied unless a rule grants it; a right the running kernel does not know
is simply not handled, so each ABI version only widens what is denied. The restriction is
irreversible, inherited by children and threads created afterwards, and holds only for the
calling thread among those already running: callers restrict before starting any thread.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import os
import platform
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# Syscall numbers: the same on x86_64 and aarch64 (new syscalls share the generic table).
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_SUPPORTED_MACHINES = frozenset({"x86_64", "aarch64", "arm64"})

_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem rights, with the ABI version that introduced each.
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
# The only rights a rule on a regular file (rather than a directory) may carry.
_FS_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV

NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
_NET_ABI = 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6
_SCOPE_ABI = 6

READ = FS_READ_FILE | FS_READ_DIR
READ_EXECUTE = READ | FS_EXECUTE
READ_WRITE = (
    READ
    | FS_WRITE_FILE
    | FS_REMOVE_DIR
    | FS_REMOVE_FILE
    | FS_MAKE_DIR
    | FS_MAKE_REG
    | FS_MAKE_SOCK
    | FS_MAKE_FIFO
    | FS_MAKE_SYM
    | FS_REFER
    | FS_TRUNCATE
)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the uapi header: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class IsolationLevel(enum.IntEnum):
    """What Landlock enforces on a model host, weakest first; the name leads the wire string."""

    NONE = 0
    LANDLOCK_FS = 1
    LANDLOCK_FS_NET = 2


# Appended to the level's name on the wire when the seccomp socket filter is in place too.
SECCOMP_NET_SUFFIX = "+SECCOMP_NET"


@dataclass(frozen=True, kw_only=True)
class Isolation:
    """What the kernel enforces on a model host: the Landlock level, and the seccomp filter."""

    level: IsolationLevel
    reason: str
    seccomp_net: bool = False

    @property
    def wire(self) -> str:
        """`LANDLOCK_FS_NET`, `LANDLOCK_FS_NET+SECCOMP_NET`, `NONE+SECCOMP_NET`, ..."""
        return self.level.name + (SECCOMP_NET_SUFFIX if self.seccomp_net else "")


class LandlockUnavailable(Exception):
    """The kernel (or a seccomp filter in front of it) refuses Landlock; `str` says how."""


@dataclass(frozen=True, kw_only=True)
class PathRule:
    path: Path
    access: int


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _failed(call: str) -> LandlockUnavailable:
    code = ctypes.get_errno()
    name = errno.errorcode.get(code, str(code))
    return LandlockUnavailable(f"{call} failed: errno {code} {name} ({os.strerror(code)})")


def abi_version() -> int:
    """The kernel's Landlock ABI version. Raises LandlockUnavailable with the errno otherwise."""
    machine = platform.machine()
    if platform.system() != "Linux" or machine not in _SUPPORTED_MACHINES:
        raise LandlockUnavailable(
            f"Landlock syscalls are not wired for {platform.system()} {machine}"
        )
    libc = _libc()
    version = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    if version < 0:
        raise _failed("landlock_create_ruleset(LANDLOCK_CREATE_RULESET_VERSION)")
    return int(version)


def handled_fs_rights(abi: int) -> int:
    return _FS_BY_ABI[max(version for version in _FS_BY_ABI if version <= abi)]


def restrict_self(rules: Iterable[PathRule], *, deny_tcp: bool = True) -> Isolation:
    """Deny this process every filesystem access but `rules` (and TCP when the ABI allows).

    Paths that do not exist are skipped. Raises LandlockUnavailable when nothing was enforced.
    """
    abi = abi_version()
    libc = _libc()
    handled_fs = handled_fs_rights(abi)
    net_enforced = deny_tcp and abi >= _NET_ABI
    attr = _RulesetAttr(
        handled_access_fs=handled_fs,
        # Handled with no rule granting a port: every TCP bind and connect is refused.
        handled_access_net=(NET_BIND_TCP | NET_CONNECT_TCP) if net_enforced else 0,
        # No abstract unix sockets or signals out of the sandbox (the worker's included).
        scoped=(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= _SCOPE_ABI else 0,
    )
    ruleset_fd = libc.syscall(
        _SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0
    )
    if ruleset_fd < 0:
        raise _failed("landlock_create_ruleset")
    try:
        for rule in rules:
            _add_path_rule(libc, int(ruleset_fd), rule, handled_fs)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _failed("prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset_fd), 0) != 0:
            raise _failed("landlock_restrict_self")
    finally:
        os.close(ruleset_fd)
    if net_enforced:
        return Isolation(
            level=IsolationLevel.LANDLOCK_FS_NET,
            reason=f"Landlock ABI {abi}: filesystem allow-list, TCP bind and connect denied",
        )
    why = "TCP rules not requested" if not deny_tcp else f"TCP rules need ABI {_NET_ABI}"
    return Isolation(
        level=IsolationLevel.LANDLOCK_FS,
        reason=f"Landlock ABI {abi}: filesystem allow-list only ({why}; network unrestricted)",
    )


def _add_path_rule(libc: ctypes.CDLL, ruleset_fd: int, rule: PathRule, handled_fs: int) -> None:
    try:
        fd = os.open(rule.path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        access = rule.access & handled_fs
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= _FS_FILE_RIGHTS
        if not access:
            return
        beneath = _PathBeneathAttr(allowed_access=access, parent_fd=fd)
        if (
            libc.syscall(
                _SYS_ADD_RULE,
                ctypes.c_int(ruleset_fd),
                _RULE_PATH_BENEATH,
                ctypes.byref(beneath),
                0,
            )
            != 0
        ):
            raise _failed(f"landlock_add_rule({str(rule.path)!r})")
    finally:
        os.close(fd)

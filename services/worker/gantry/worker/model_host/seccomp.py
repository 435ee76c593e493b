"""The model host's seccomp socket filter: the classic-BPF program (pure) and installing it (IO).

Landlock refuses TCP bind and connect but knows nothing of UDP, raw or packet sockets: a model host
could still resolve names and `sendto` anywhere. This filter makes `socket(2)` answer EACCES for
every address family but AF_NETLINK (interface lookups some libraries make), `socketpair(2)` the
same (a datagram pair end may `sendto` any pathname socket without `connect`), and
`io_uring_setup(2)` EPERM, since an io_uring `IORING_OP_SOCKET` creates sockets without the
`socket` syscall.

Unix sockets are a way out too: a pathname socket (a local database, a container daemon) is not a
file Landlock governs (this kernel's Landlock scopes abstract sockets only), so `connect(2)` to one
would succeed. The host needs neither a new Unix socket nor `connect` at all (its channel is an
inherited socketpair), so both are refused (EACCES) - unless the host drives CUDA: the driver
opens AF_UNIX sockets and connects them to the persistence daemon and the MPS control daemon,
so a CUDA host keeps AF_UNIX and `connect` (`UnixSockets.CUDA`). `connect` carries only a pointer
to the address, which seccomp cannot read, so it is all or nothing. Families are allow-listed rather
than denied one by one: AF_VSOCK, AF_RDS, AF_TIPC, AF_XDP and whatever a later kernel adds reach
beyond this machine as surely as AF_INET does. A syscall made through another ABI (i386 `int 0x80`,
x32) would be checked against another table, so the filter kills the process instead. The filter
is irreversible and inherited by every child; it is installed on all threads at once.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import os
import platform
import socket
import struct
import sys
from dataclasses import dataclass

# Classic BPF opcodes (linux/filter.h, linux/bpf_common.h).
_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_JSET_K = 0x05 | 0x40 | 0x00  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K

# Filter verdicts (linux/seccomp.h); ERRNO carries the errno in its low 16 bits.
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000

# Offsets into struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6].
_NR_OFFSET = 0
_ARCH_OFFSET = 4
# args[0]'s low 32 bits on a little-endian machine; socket(2) takes `int family`, so the kernel
# itself ignores the high word.
_ARG0_LOW_OFFSET = 16

_X32_SYSCALL_BIT = 0x40000000


class UnixSockets(enum.Enum):
    """Whether the host may open Unix sockets and connect: only the CUDA driver needs to."""

    DENIED = "DENIED"
    CUDA = "CUDA"  # the driver reaches nvidia-persistenced and the MPS daemon this way


# Families a model host may still open, by policy; every other one is refused.
ALLOWED_FAMILIES = {
    UnixSockets.DENIED: (socket.AF_NETLINK,),
    UnixSockets.CUDA: (socket.AF_UNIX, socket.AF_NETLINK),
}

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1

DESCRIPTIONS = {
    UnixSockets.DENIED: (
        "seccomp: sockets other than AF_NETLINK denied (UDP and AF_UNIX included), connect "
        "denied, io_uring denied"
    ),
    UnixSockets.CUDA: (
        "seccomp: sockets other than AF_UNIX and AF_NETLINK denied (UDP included), io_uring "
        "denied; AF_UNIX and connect kept for the CUDA driver's daemons"
    ),
}


@dataclass(frozen=True, kw_only=True)
class Arch:
    """One syscall ABI: its AUDIT_ARCH value and the numbers the filter checks."""

    name: str
    audit_arch: int
    socket_nr: int
    socketpair_nr: int
    connect_nr: int
    io_uring_setup_nr: int
    seccomp_nr: int
    # x86_64 also accepts x32 syscalls (same AUDIT_ARCH, numbers with this bit set).
    foreign_nr_bit: int = 0


X86_64 = Arch(
    name="x86_64",
    audit_arch=0xC000003E,
    socket_nr=41,
    socketpair_nr=53,
    connect_nr=42,
    io_uring_setup_nr=425,
    seccomp_nr=317,
    foreign_nr_bit=_X32_SYSCALL_BIT,
)
AARCH64 = Arch(
    name="aarch64",
    audit_arch=0xC00000B7,
    socket_nr=198,
    socketpair_nr=199,
    connect_nr=203,
    io_uring_setup_nr=425,
    seccomp_nr=277,
)
_ARCH_BY_MACHINE = {"x86_64": X86_64, "aarch64": AARCH64, "arm64": AARCH64}


@dataclass(frozen=True)
class Instruction:
    """struct sock_filter: jumps are relative to the next instruction."""

    code: int
    jt: int
    jf: int
    k: int


@dataclass(frozen=True, kw_only=True)
class SeccompOutcome:
    installed: bool
    reason: str


def _load(offset: int) -> Instruction:
    return Instruction(_LD_W_ABS, 0, 0, offset)


def _ret(verdict: int) -> Instruction:
    return Instruction(_RET_K, 0, 0, verdict)


def socket_filter(arch: Arch, unix: UnixSockets) -> tuple[Instruction, ...]:
    """The filter for `arch`: foreign ABIs killed, other families EACCES (socket and socketpair
    alike: both take the family first), io_uring EPERM, and (unless `unix` keeps them for CUDA)
    connect EACCES."""
    head = [
        _load(_ARCH_OFFSET),
        Instruction(_JEQ_K, 1, 0, arch.audit_arch),
        _ret(RET_KILL_PROCESS),
        _load(_NR_OFFSET),
    ]
    if arch.foreign_nr_bit:
        head += [Instruction(_JSET_K, 0, 1, arch.foreign_nr_bit), _ret(RET_KILL_PROCESS)]
    allowed = ALLOWED_FAMILIES[unix]
    families = [
        Instruction(_JEQ_K, len(allowed) - index, 0, int(family))
        for index, family in enumerate(allowed)
    ]
    socket_rule = [
        _load(_ARG0_LOW_OFFSET),
        *families,
        _ret(RET_ERRNO | errno.EACCES),
        _ret(RET_ALLOW),
    ]
    denied = [(arch.io_uring_setup_nr, RET_ERRNO | errno.EPERM)]
    if unix is UnixSockets.DENIED:
        denied.append((arch.connect_nr, RET_ERRNO | errno.EACCES))
    whole_calls = [
        op for nr, verdict in denied for op in (Instruction(_JEQ_K, 0, 1, nr), _ret(verdict))
    ]
    dispatch = [
        # Over the denied calls and the final allow, into socket_rule.
        Instruction(_JEQ_K, len(whole_calls) + 2, 0, arch.socket_nr),
        Instruction(_JEQ_K, len(whole_calls) + 1, 0, arch.socketpair_nr),
        *whole_calls,
        _ret(RET_ALLOW),
    ]
    return (*head, *dispatch, *socket_rule)


def encode(program: tuple[Instruction, ...]) -> bytes:
    """The program as the kernel reads it: an array of struct sock_filter in native byte order."""
    return b"".join(struct.pack("=HBBI", op.code, op.jt, op.jf, op.k) for op in program)


def arch_of(machine: str) -> Arch | None:
    return _ARCH_BY_MACHINE.get(machine)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _errno_text(call: str) -> str:
    code = ctypes.get_errno()
    name = errno.errorcode.get(code, str(code))
    return f"{call} failed: errno {code} {name} ({os.strerror(code)})"


def install_socket_filter(unix: UnixSockets = UnixSockets.DENIED) -> SeccompOutcome:
    """Install the filter on every thread of this process for good; never raises for the kernel."""
    machine = platform.machine()
    arch = arch_of(machine)
    # The filter reads args[0]'s low word at the offset a little-endian machine keeps it.
    if platform.system() != "Linux" or arch is None or sys.byteorder != "little":
        return SeccompOutcome(
            installed=False,
            reason=f"no seccomp socket filter for {platform.system()} {machine}",
        )
    program = encode(socket_filter(arch, unix))
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len=len(program) // 8, filter=ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    # Required for an unprivileged filter; Landlock has usually set it already.
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return SeccompOutcome(installed=False, reason=_errno_text("prctl(PR_SET_NO_NEW_PRIVS)"))
    # TSYNC: a thread some import started behind our back is filtered too (or nothing is).
    result = libc.syscall(
        arch.seccomp_nr,
        _SECCOMP_SET_MODE_FILTER,
        _SECCOMP_FILTER_FLAG_TSYNC,
        ctypes.byref(fprog),
    )
    if result == 0:
        return SeccompOutcome(installed=True, reason=DESCRIPTIONS[unix])
    if result > 0:
        return SeccompOutcome(
            installed=False,
            reason=f"seccomp(SECCOMP_SET_MODE_FILTER, TSYNC) refused: thread {result} disagrees",
        )
    if ctypes.get_errno() != errno.ENOSYS:
        return SeccompOutcome(
            installed=False, reason=_errno_text("seccomp(SECCOMP_SET_MODE_FILTER)")
        )
    # A runtime that hides seccomp(2) may still allow the prctl form (this thread only).
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return SeccompOutcome(installed=False, reason=_errno_text("prctl(PR_SET_SECCOMP)"))
    return SeccompOutcome(installed=True, reason=DESCRIPTIONS[unix])

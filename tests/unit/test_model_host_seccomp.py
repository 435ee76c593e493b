"""The seccomp socket filter: its BPF program run here by a tiny interpreter.

The program is checked by evaluating it, not by its shape alone: a wrong jump offset shows up as
a wrong verdict. The kernel's answer is checked in throwaway child processes, which keep the
filter for good, in tests/integration/test_model_host_seccomp_enforced.py.
"""

from __future__ import annotations

import errno
import socket
import struct

import pytest

from gantry.worker.model_host import seccomp
from gantry.worker.model_host.seccomp import (
    AARCH64,
    RET_ALLOW,
    RET_ERRNO,
    RET_KILL_PROCESS,
    X86_64,
    Arch,
    Instruction,
    UnixSockets,
)

AUDIT_ARCH_I386 = 0x40000003
AF_VSOCK = 40
X32_SYSCALL_BIT = 0x40000000
NR_READ = {"x86_64": 0, "aarch64": 63}
DENIED_SOCKET = RET_ERRNO | errno.EACCES


def verdict(program: tuple[Instruction, ...], *, arch: int, nr: int, args: tuple[int, ...]) -> int:
    """What the kernel's classic-BPF interpreter would return for this struct seccomp_data."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args, *[0] * (6 - len(args)))
    accumulator, pc = 0, 0
    for _ in range(len(program)):  # classic BPF only jumps forward
        op = program[pc]
        if op.code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            (accumulator,) = struct.unpack_from("<I", data, op.k)
            pc += 1
        elif op.code == 0x15:  # BPF_JMP | BPF_JEQ | BPF_K
            pc += 1 + (op.jt if accumulator == op.k else op.jf)
        elif op.code == 0x45:  # BPF_JMP | BPF_JSET | BPF_K
            pc += 1 + (op.jt if accumulator & op.k else op.jf)
        elif op.code == 0x06:  # BPF_RET | BPF_K
            return op.k
        else:
            raise AssertionError(f"unexpected opcode {op.code:#x}")
    raise AssertionError("the program ran off its end")


@pytest.mark.parametrize("arch", [X86_64, AARCH64], ids=lambda arch: arch.name)
def test_the_first_thing_the_filter_does_is_kill_a_syscall_made_through_another_abi(
    arch: Arch,
) -> None:
    program = seccomp.socket_filter(arch, UnixSockets.DENIED)
    assert program[:3] == (
        Instruction(0x20, 0, 0, 4),  # seccomp_data.arch
        Instruction(0x15, 1, 0, arch.audit_arch),
        Instruction(0x06, 0, 0, RET_KILL_PROCESS),
    )
    other = AARCH64 if arch is X86_64 else X86_64
    for foreign in (AUDIT_ARCH_I386, other.audit_arch):
        for nr in (arch.socket_nr, NR_READ[arch.name]):
            assert verdict(program, arch=foreign, nr=nr, args=(2,)) == RET_KILL_PROCESS


# (family, verdict without CUDA, verdict for a CUDA host)
FAMILY_VERDICTS = [
    (socket.AF_INET, DENIED_SOCKET, DENIED_SOCKET),
    (socket.AF_INET6, DENIED_SOCKET, DENIED_SOCKET),
    (socket.AF_PACKET, DENIED_SOCKET, DENIED_SOCKET),
    (AF_VSOCK, DENIED_SOCKET, DENIED_SOCKET),
    (0, DENIED_SOCKET, DENIED_SOCKET),
    # The host's own channel is an inherited socketpair: only the CUDA driver opens Unix sockets.
    (socket.AF_UNIX, DENIED_SOCKET, RET_ALLOW),
    (socket.AF_NETLINK, RET_ALLOW, RET_ALLOW),
    # socket(2) takes an `int`: the kernel, like the filter, reads only the low word.
    ((1 << 32) | socket.AF_INET, DENIED_SOCKET, DENIED_SOCKET),
    ((0xFFFFFFFF << 32) | socket.AF_UNIX, DENIED_SOCKET, RET_ALLOW),
    ((0xFFFFFFFF << 32) | socket.AF_NETLINK, RET_ALLOW, RET_ALLOW),
]


@pytest.mark.parametrize(("family", "without_cuda", "with_cuda"), FAMILY_VERDICTS)
@pytest.mark.parametrize("arch", [X86_64, AARCH64], ids=lambda arch: arch.name)
def test_sockets_of_every_family_but_netlink_are_refused_and_unix_only_kept_for_cuda(
    arch: Arch, family: int, without_cuda: int, with_cuda: int
) -> None:
    for unix, expected in ((UnixSockets.DENIED, without_cuda), (UnixSockets.CUDA, with_cuda)):
        program = seccomp.socket_filter(arch, unix)
        # socketpair(2) takes the family first too: a datagram pair end could `sendto` any
        # pathname socket without `connect`.
        for nr in (arch.socket_nr, arch.socketpair_nr):
            assert verdict(program, arch=arch.audit_arch, nr=nr, args=(family, 2, 0)) == (
                expected
            ), (unix, nr)


@pytest.mark.parametrize("arch", [X86_64, AARCH64], ids=lambda arch: arch.name)
def test_connect_is_refused_with_eacces_unless_the_cuda_driver_needs_it(arch: Arch) -> None:
    # connect(fd, address, length): the address is a pointer, so no argument decides it.
    for fd in (0, 3, 1023):
        denied = seccomp.socket_filter(arch, UnixSockets.DENIED)
        assert verdict(denied, arch=arch.audit_arch, nr=arch.connect_nr, args=(fd, 1, 110)) == (
            RET_ERRNO | errno.EACCES
        )
        cuda = seccomp.socket_filter(arch, UnixSockets.CUDA)
        assert verdict(cuda, arch=arch.audit_arch, nr=arch.connect_nr, args=(fd, 1, 110)) == (
            RET_ALLOW
        )


@pytest.mark.parametrize("unix", list(UnixSockets), ids=lambda unix: unix.name)
@pytest.mark.parametrize("arch", [X86_64, AARCH64], ids=lambda arch: arch.name)
def test_io_uring_is_refused_and_every_other_syscall_allowed(arch: Arch, unix: UnixSockets) -> None:
    program = seccomp.socket_filter(arch, unix)
    native = arch.audit_arch
    assert verdict(program, arch=native, nr=425, args=(8, 0)) == RET_ERRNO | errno.EPERM
    for nr in (NR_READ[arch.name], 426, 427, arch.seccomp_nr):
        assert verdict(program, arch=native, nr=nr, args=(socket.AF_INET,)) == RET_ALLOW


def test_x32_syscalls_on_x86_64_are_killed_however_harmless() -> None:
    program = seccomp.socket_filter(X86_64, UnixSockets.DENIED)
    for nr in (X32_SYSCALL_BIT | NR_READ["x86_64"], X32_SYSCALL_BIT | X86_64.socket_nr):
        assert verdict(program, arch=X86_64.audit_arch, nr=nr, args=(1,)) == RET_KILL_PROCESS


def test_the_program_encodes_as_an_array_of_eight_byte_sock_filters() -> None:
    program = seccomp.socket_filter(X86_64, UnixSockets.DENIED)
    encoded = seccomp.encode(program)
    assert len(encoded) == 8 * len(program)
    assert struct.unpack_from("=HBBI", encoded, 8) == (0x15, 1, 0, X86_64.audit_arch)


def test_machines_without_a_known_abi_get_no_filter() -> None:
    assert seccomp.arch_of("x86_64") is X86_64
    assert seccomp.arch_of("arm64") is AARCH64
    assert seccomp.arch_of("riscv64") is None

"""The seccomp filter enforced for real: a filtered child process opens no IP socket, and no Unix
socket nor connect unless it drives CUDA; a syscall made through another ABI kills it.

The filter program itself is checked instruction by instruction in
tests/unit/test_model_host_seccomp.py; these run processes, which the unit guard refuses.
"""

from __future__ import annotations

import json
import platform
import signal
import subprocess
import sys
import textwrap

import pytest

from gantry.worker.model_host import seccomp
from tests.unit.test_model_host_seccomp import X32_SYSCALL_BIT

# --- the kernel's answer, in child processes that keep the filter --------------------------------

# Machine code for `mov eax, 20 (i386 getpid); int 0x80; ret`: a syscall through the i386 ABI.
_I386_SYSCALL = """
import ctypes, mmap
page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))
address = ctypes.addressof(ctypes.c_char.from_buffer(page))
ctypes.CFUNCTYPE(ctypes.c_int)(address)()
"""
_X32_SYSCALL = f"""
import ctypes
ctypes.CDLL(None).syscall({X32_SYSCALL_BIT | 39})  # x32 getpid
"""

_INSTALL_AND_PROBE = textwrap.dedent(
    """
    import ctypes, errno, json, socket, sys
    from gantry.worker.model_host import seccomp
    outcome = seccomp.install_socket_filter(seccomp.UnixSockets[sys.argv[1]])
    def attempt(family, kind):
        try:
            socket.socket(family, kind).close()
        except OSError as exc:
            return f"{type(exc).__name__} {errno.errorcode[exc.errno]}"
        return "allowed"
    def unix_pair():
        # A datagram pair end could sendto any pathname socket with no connect: socketpair(2)
        # takes socket(2)'s family rule.
        try:
            end, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        except OSError as exc:
            return f"{type(exc).__name__} {errno.errorcode[exc.errno]}"
        end.close()
        other.close()
        return "allowed"
    def unix_connect():
        # Re-connecting a socketpair end (what the host inherits) needs connect(2). Where the
        # pair itself is refused, a netlink socket (an allowed family) stands in: the filter
        # refuses connect(2) whatever the socket.
        try:
            end, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            target = "/nonexistent/gantry-probe.sock"
        except PermissionError:
            end, other, target = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW), None, (0, 0)
        try:
            end.connect(target)
        except OSError as exc:
            return f"{type(exc).__name__} {errno.errorcode[exc.errno]}"
        finally:
            end.close()
            if other is not None:
                other.close()
        return "allowed"
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params
    ring = libc.syscall(425, 8, params)
    print(json.dumps({
        "installed": outcome.installed,
        "reason": outcome.reason,
        "inet_dgram": attempt(socket.AF_INET, socket.SOCK_DGRAM),
        "inet6_stream": attempt(socket.AF_INET6, socket.SOCK_STREAM),
        "unix_stream": attempt(socket.AF_UNIX, socket.SOCK_STREAM),
        "netlink": attempt(socket.AF_NETLINK, socket.SOCK_RAW),
        "unix_pair": unix_pair(),
        "unix_connect": unix_connect(),
        "io_uring": "allowed" if ring >= 0 else errno.errorcode[ctypes.get_errno()],
    }))
    """
)


def _run_filtered(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-c", script, *args], capture_output=True, text=True, timeout=60
    )


def _probe(unix: seccomp.UnixSockets) -> dict[str, object]:
    completed = _run_filtered(_INSTALL_AND_PROBE, unix.name)
    assert completed.returncode == 0, completed.stderr
    outcome = json.loads(completed.stdout)
    if not outcome["installed"]:
        pytest.skip(f"seccomp is unavailable here: {outcome['reason']}")
    assert outcome["reason"] == seccomp.DESCRIPTIONS[unix]
    assert outcome["inet_dgram"] == "PermissionError EACCES"
    assert outcome["inet6_stream"] == "PermissionError EACCES"
    assert outcome["netlink"] == "allowed"
    assert outcome["io_uring"] == "EPERM"
    assert isinstance(outcome, dict)
    return outcome


def test_a_filtered_process_opens_no_ip_socket_udp_included_nor_unix_socket_nor_connects() -> None:
    outcome = _probe(seccomp.UnixSockets.DENIED)
    assert outcome["unix_stream"] == "PermissionError EACCES"
    assert outcome["unix_pair"] == "PermissionError EACCES"
    assert outcome["unix_connect"] == "PermissionError EACCES"


def test_a_cuda_host_keeps_unix_sockets_and_connect_for_the_driver_but_no_ip_socket() -> None:
    outcome = _probe(seccomp.UnixSockets.CUDA)
    assert outcome["unix_stream"] == "allowed"
    assert outcome["unix_pair"] == "allowed"
    # Past the filter: the kernel itself answers that the path does not exist.
    assert outcome["unix_connect"] == "FileNotFoundError ENOENT"


_INSTALL = """
from gantry.worker.model_host import seccomp
assert seccomp.install_socket_filter().installed
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="i386 and x32 are x86_64's other ABIs")
@pytest.mark.parametrize("foreign_call", [_I386_SYSCALL, _X32_SYSCALL], ids=["i386", "x32"])
def test_a_syscall_through_another_abi_kills_the_filtered_process(foreign_call: str) -> None:
    unfiltered = _run_filtered(foreign_call)
    if unfiltered.returncode != 0:
        pytest.skip(f"this kernel refuses the ABI outright ({unfiltered.returncode})")
    probe = _run_filtered(_INSTALL_AND_PROBE, seccomp.UnixSockets.DENIED.name)
    if not json.loads(probe.stdout)["installed"]:
        pytest.skip("seccomp is unavailable here")
    filtered = _run_filtered(_INSTALL + foreign_call)
    assert filtered.returncode == -signal.SIGSYS, filtered.stderr

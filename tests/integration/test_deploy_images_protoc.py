"""Each image's protoc step, run as its Dockerfile runs it, makes every stub its service imports.

The Dockerfiles are parsed and checked statically in tests/unit/test_deploy_images.py; these run
grpc_tools.protoc, a process, which the unit guard refuses.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.deploy_manifests_support import (
    REPO,
    SERVICES,
)
from tests.unit.test_deploy_images import dockerfile_path, parse_dockerfile

GENERATED_IMPORT = re.compile(
    r"^\s*(?:from\s+gantry\.(v1|kserve)\s+import\s+([\w, ]+)|import\s+gantry\.(v1|kserve)\.(\w+))",
    re.MULTILINE,
)


def generated_modules_imported(service: str) -> set[str]:
    """gantry.v1 / gantry.kserve modules (the generated stubs) the service's code imports."""
    wanted: set[str] = set()
    for source in (REPO / "services" / service).rglob("*.py"):
        for match in GENERATED_IMPORT.finditer(source.read_text()):
            if match.group(1):
                names = [part.split(" as ")[0].strip() for part in match.group(2).split(",")]
                wanted |= {f"gantry.{match.group(1)}.{name}" for name in names if name}
            else:
                wanted.add(f"gantry.{match.group(3)}.{match.group(4)}")
    return wanted


def run_image_protoc(text: str, workdir: Path) -> None:
    """The image's own protoc commands, run as its build stage would, with our python."""
    for keyword, args in parse_dockerfile(text):
        if keyword != "RUN" or "grpc_tools.protoc" not in args:
            continue
        for command in args.split("&&"):
            argv = shlex.split(command)
            if "grpc_tools.protoc" not in argv:
                continue
            argv[0] = sys.executable
            expanded = [
                str(path.relative_to(workdir)) if "*" in arg else arg
                for arg in argv
                for path in (sorted(workdir.glob(arg)) if "*" in arg else [Path(arg)])
            ]
            done = subprocess.run(expanded, cwd=workdir, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("service", SERVICES)
def test_image_generates_every_stub_its_service_imports(service: str, tmp_path: Path) -> None:
    # The stubs are not committed: an image whose protoc step misses a package (the control plane
    # importing gantry.kserve for the Open Inference Protocol) builds, then dies on import.
    shutil.copytree(REPO / "proto", tmp_path / "proto")
    (tmp_path / "libs").mkdir()
    run_image_protoc(dockerfile_path(service).read_text(), tmp_path)
    wanted = generated_modules_imported(service)
    assert wanted, f"{service} imports no generated stub: the import scan is broken"
    missing = sorted(
        name
        for name in wanted
        if not (tmp_path / "libs" / Path(*name.split("."))).with_suffix(".py").is_file()
    )
    assert missing == [], f"{service} image does not generate {missing}"


def test_stub_check_catches_a_missing_package(tmp_path: Path) -> None:
    # The control plane's Dockerfile as it was before its kserve step: gantry.kserve is missing.
    lines = dockerfile_path("controlplane").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "-I gantry/kserve" in line)
    lines[at - 1] = lines[at - 1].removesuffix(" \\")
    without_kserve = "\n".join(lines[:at] + lines[at + 2 :])
    assert "gantry/kserve" not in without_kserve
    shutil.copytree(REPO / "proto", tmp_path / "proto")
    (tmp_path / "libs").mkdir()
    run_image_protoc(without_kserve, tmp_path)
    assert (tmp_path / "libs" / "gantry" / "v1" / "common_pb2.py").is_file()
    assert not (tmp_path / "libs" / "gantry" / "kserve").exists()
    assert "gantry.kserve.grpc_service_pb2_grpc" in generated_modules_imported("controlplane")

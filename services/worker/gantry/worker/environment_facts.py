"""What the worker tells the control plane its default environment can run (no ML import here)."""

from __future__ import annotations

import sys
from importlib import metadata

from gantry.v1 import worker_gateway_pb2 as wg

_PACKAGES = ("torch", "transformers", "sentence-transformers")


def default_environment(python_executable: str) -> wg.RuntimeEnvironment:
    # Versions come from package metadata so the worker parent never imports torch itself.
    versions = {"python": sys.version.split()[0]}
    for package in _PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    adapters = ["sentence_transformers"] if "sentence-transformers" in versions else []
    return wg.RuntimeEnvironment(
        environment_id="default",
        python_executable=python_executable,
        adapters=adapters,
        versions=versions,
    )

"""Static inspection of an artifact set: config files only, nothing imported or executed."""

from gantry.worker.inspection.artifact_files import ArtifactFiles
from gantry.worker.inspection.dispatch import choose_inspector, inspect_artifact

__all__ = ["ArtifactFiles", "choose_inspector", "inspect_artifact"]

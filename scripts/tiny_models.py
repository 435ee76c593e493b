"""Build a tiny random model directory an operator can register to try a media adapter (or text
generation) against `make run`: the test fixtures' own builders (tests/fixtures/tiny_*.py), so
what is tried is what the tests serve. No hub, no network: configs of a few hidden units, random
weights (seeded), tokenizers built locally. The outputs are random tokens; what they show is the
pipeline, not a model's accuracy.

    .venv/bin/python scripts/tiny_models.py whisper .gantry/artifacts/tiny-whisper
    .venv/bin/python scripts/tiny_models.py trocr .gantry/artifacts/tiny-trocr
    .venv/bin/python scripts/tiny_models.py siglip2 .gantry/artifacts/tiny-siglip2
    .venv/bin/python scripts/tiny_models.py causal_lm .gantry/artifacts/tiny-causal-lm
    .venv/bin/python scripts/tiny_models.py causal_lm_gguf .gantry/artifacts/tiny-llama

`causal_lm_gguf` writes the same causal LM twice: DIR/hf (what `causal_lm` writes) and DIR/gguf,
its one GGUF file for the managed llama.cpp server (`llama_cpp_server`, environment "llama");
register DIR/gguf.

Run it from the repository root with .venv's interpreter (torch, transformers, tokenizers; the
image processors' configs are written as JSON, so the vision environment is not needed to build).
It prints the commands that walk the model through the gates and try it on the samples of
scripts/sample_media.py (written to .gantry/samples). Exit 2: a usage error (an unknown
KIND, a DIR that is not empty), 1: the builder failed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPOSITORY = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, kw_only=True)
class TinyModel:
    """One kind: the fixture module and builder that make it, the adapter that serves it, the
    runtime environment its adapter runs in and the command that tries it."""

    module: str
    builder: str
    adapter: str
    environment: str  # "" = the worker's default
    capability: str
    try_it: tuple[str, ...]


KINDS: dict[str, TinyModel] = {
    "whisper": TinyModel(
        module="tests.fixtures.tiny_whisper",
        builder="build_tiny_whisper",
        adapter="transformers_whisper",
        environment="",
        capability="tiny-speech",
        try_it=("transcribe .gantry/samples/long-tone.wav --capability tiny-speech --timestamps",),
    ),
    "trocr": TinyModel(
        module="tests.fixtures.tiny_trocr",
        builder="build_tiny_trocr",
        adapter="transformers_trocr",
        environment="vision",
        capability="tiny-ocr",
        try_it=("ocr .gantry/samples/text.png --capability tiny-ocr",),
    ),
    "siglip2": TinyModel(
        module="tests.fixtures.tiny_siglip2",
        builder="build_tiny_siglip2",
        adapter="transformers_siglip2",
        environment="vision",
        capability="tiny-siglip",
        try_it=(
            "embed-image .gantry/samples/text.png --capability tiny-siglip",
            "classify .gantry/samples/text.png --capability tiny-siglip "
            '--labels "a photo of a cat" "the text gantry"',
        ),
    ),
    "causal_lm": TinyModel(
        module="tests.fixtures.tiny_causal_lm",
        builder="build_tiny_causal_lm",
        adapter="transformers_causal_lm",
        environment="",
        capability="tiny-chat",
        try_it=('generate "Once upon a time" --capability tiny-chat --max-tokens 32',),
    ),
    "causal_lm_gguf": TinyModel(
        module="tests.fixtures.tiny_causal_lm_gguf",
        builder="build_tiny_causal_lm_gguf",  # returns DIR/gguf, the directory to register
        adapter="llama_cpp_server",
        environment="llama",
        capability="tiny-llama",
        try_it=('generate "Once upon a time" --capability tiny-llama --max-tokens 32',),
    ),
}


def builder_of(kind: TinyModel) -> Callable[[Path], Path]:
    """The fixture's plain builder, imported only now: a kind whose fixture is missing fails alone,
    and only the kind asked for pays for importing torch and transformers."""
    if str(REPOSITORY) not in sys.path:
        sys.path.insert(0, str(REPOSITORY))  # `tests` is a package of the repository, not installed
    module = importlib.import_module(kind.module)
    build: Callable[[Path], Path] = getattr(module, kind.builder)
    return build


def next_steps(kind: TinyModel, directory: Path, name: str) -> str:
    """The commands that register the model in `directory` as `name` and walk it through every
    gate to a capability."""
    gantry = ".venv/bin/gantry"
    environment = f" --environment {kind.environment}" if kind.environment else ""
    return "\n".join(
        [
            f"{gantry} artifacts register {directory} --name {name}",
            f"{gantry} assess ARTIFACT_SET_ID{environment}",
            f"{gantry} profile ASSESSMENT_ID --name {name}-cpu --adapter {kind.adapter}",
            f"{gantry} probe PROFILE_ID",
            f'{gantry} approve CANDIDATE_ID --reason "tiny random {kind.adapter} fixture"',
            f"{gantry} deploy APPROVAL_ID --capability {kind.capability}",
            *(f"{gantry} {command}" for command in kind.try_it),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("kind", choices=sorted(KINDS), metavar="KIND", help=", ".join(KINDS))
    parser.add_argument(
        "directory",
        type=Path,
        metavar="DIR",
        help="a new or empty directory, under the artifact root to register it (.gantry/artifacts)",
    )
    args = parser.parse_args(argv)
    kind, directory = KINDS[args.kind], args.directory
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        # A registered directory's bytes are its identity: never build over one.
        parser.error(f"{directory} exists and is not an empty directory; give a new one")
    try:
        build = builder_of(kind)
    except (ImportError, AttributeError) as exc:
        print(f"error: cannot import {kind.module}.{kind.builder}: {exc}", file=sys.stderr)
        return 1
    built = build(directory)
    files = sorted(path for path in built.rglob("*") if path.is_file())
    size = sum(path.stat().st_size for path in files)
    print(f"built a tiny random {args.kind} in {built} ({len(files)} files, {size} bytes)")
    if kind.environment:
        print(
            f"its adapter runs in the {kind.environment!r} environment (make "
            f"{kind.environment}-env; the worker maps it with GANTRY_PYTHON_ENV_MAP_JSON)"
        )
    print("next (each command prints the id the next one takes):")
    print(next_steps(kind, built, directory.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())

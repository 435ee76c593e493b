"""A model host's runtime environment: the Python executable per environment id, and the
allow-listed process environment it starts with (offline flags forced, nothing else inherited)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gantry.common.errors import GantryError

ENV_MAP_JSON = "GANTRY_PYTHON_ENV_MAP_JSON"
ENV_MAP_FILE = "GANTRY_PYTHON_ENV_MAP_FILE"
DEFAULT_EXECUTABLE = "GANTRY_PYTHON_EXECUTABLE"
DEFAULT_ENVIRONMENT_ID = "default"

# Every model host runs with these, whatever the worker's own environment says: the host must never
# reach a model hub, and progress bars and tokenizer thread pools only add noise to a child process.
OFFLINE_ENVIRONMENT: Mapping[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

# What a model host's CPU threads do between parallel regions when nothing better is known: the
# worker measures a better one per machine and environment (cpu_calibration, cpu_policy), which
# hosts get as GOMP_SPINCOUNT (libgomp honours it over this), and an operator's own wins over both.
# libgomp's default spins before sleeping; on a node whose cores the worker, the control plane or
# other hosts share, spinning threads take the CPU those processes need to move the next request.
# Measured on 2 cores with 32 concurrent callers (issue 9): the host spent 17.4 ms of CPU per
# sentence spinning and 7.9 ms sleeping (PASSIVE), and throughput rose from 0.45 to 0.63 of a
# direct batch. The price is latency when alone: one sentence's forward pass takes about 30 %
# longer, since sleeping threads must be woken for each parallel region. On a GPU node the CPU
# threads barely run; there PASSIVE costs nothing.
HOST_CPU_DEFAULTS: Mapping[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}

# A minimal PATH: the host runs no tools of its own; `platform` may still ask `uname`.
HOST_PATH = "/usr/local/bin:/usr/bin:/bin"

# The only variables a model host inherits from the worker, and only when set there. Everything
# else (credentials, tokens, cloud keys, proxy settings, PYTHON* and LD_PRELOAD) stays behind:
# the host runs model-supplied data and must hold nothing worth stealing.
INHERITED_ENVIRONMENT: Mapping[str, str] = {
    "OMP_NUM_THREADS": "the operator's CPU thread budget for torch's OpenMP pool",
    "OMP_WAIT_POLICY": "the operator's choice over HOST_CPU_DEFAULTS' PASSIVE",
    # How long libgomp's threads spin before sleeping; it wins over OMP_WAIT_POLICY. Measured per
    # machine and environment by the worker (cpu_calibration), or the operator's own.
    "GOMP_SPINCOUNT": "the spin before an idle OpenMP thread sleeps (cpu_policy)",
    "MKL_NUM_THREADS": "the same budget for MKL",
    "LANG": "text decoding in tokenizers and logs",
    "LC_ALL": "text decoding in tokenizers and logs",
    "LD_LIBRARY_PATH": "where GPU images keep the driver's libraries (libcuda)",
    "CUDA_VISIBLE_DEVICES": "which accelerators this worker may use",
    "GANTRY_TRACE_FILE": "where the host appends its spans (tests and local runs)",
    # OTLP: the host never connects to a collector (its sandbox refuses TCP); it relays its spans
    # to the worker, which exports them. So it gets only what says whether to relay and what its
    # spans' resource is; OTLP headers (often a collector's API key), certificates, protocol and
    # insecure stay with the worker, which alone uses them.
    "OTEL_EXPORTER_OTLP_ENDPOINT": "whether OTLP export is on, so the host relays its spans",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "the same, for traces alone",
    "OTEL_TRACES_EXPORTER": "`none` turns the relay off with the worker's export",
    "OTEL_SERVICE_NAME": "the service name on the host's spans, as the operator set it",
    "OTEL_RESOURCE_ATTRIBUTES": "the resource attributes on the host's spans",
    "GANTRY_LOG_FORMAT": "the host logs as the worker does (json: one object per line)",
}

# Switches on the test-only magic inputs (model_host/serving.py) in a host. Never inherited: a
# worker's environment cannot pass it on, so no production host receives or honours it. Only a
# test sets it, by starting a host with `HostLaunchSpec(test_hooks=True)`.
TEST_HOOKS_VARIABLE = "GANTRY_MODEL_HOST_TEST_HOOKS"


# Read by the host's tracing setup after a warm pool forks it, never by an import before.
TELEMETRY_VARIABLES = frozenset(name for name in INHERITED_ENVIRONMENT if name.startswith("OTEL_"))


def host_environment(
    worker_environment: Mapping[str, str],
    *,
    private_dir: Path,
    scratch_dir: Path,
    test_hooks: bool = False,
) -> dict[str, str]:
    """The complete environment of a model host: allow-listed, private home, offline flags, and
    the test hooks' switch only when a test asked for it (`test_hooks`)."""
    environment = dict(HOST_CPU_DEFAULTS)
    environment.update(
        (name, worker_environment[name])
        for name in INHERITED_ENVIRONMENT
        if name in worker_environment
    )
    environment.update(
        PATH=HOST_PATH,
        # Libraries that cache under ~ or $TMPDIR write into the host's own directory.
        HOME=str(private_dir),
        TMPDIR=str(scratch_dir),
    )
    environment.update(OFFLINE_ENVIRONMENT)
    if test_hooks:
        environment[TEST_HOOKS_VARIABLE] = "1"
    return environment


def _unavailable(environment_id: str, message: str, **metadata: str) -> GantryError:
    return GantryError(
        "RUNTIME_ENVIRONMENT_UNAVAILABLE",
        message,
        environment_id=environment_id or "default",
        **metadata,
    )


@dataclass(frozen=True, slots=True)
class MappedEnvironment:
    """One entry of an environment map: the interpreter, and how to build it when it is missing
    (`make vision-env`), so a refusal can say what to run instead of only what is absent."""

    python: str
    build: str = ""


def _mapped(value: object) -> MappedEnvironment | None:
    if isinstance(value, str):
        return MappedEnvironment(value)
    if isinstance(value, dict) and set(value) <= {"python", "build"}:
        python, build = value.get("python"), value.get("build", "")
        if isinstance(python, str) and isinstance(build, str):
            return MappedEnvironment(python, build)
    return None


def _parse_map(text: str, source: str, environment_id: str) -> dict[str, MappedEnvironment]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _unavailable(environment_id, f"{source} is not valid JSON: {exc}") from exc
    entries = (
        {key: _mapped(value) for key, value in parsed.items()} if isinstance(parsed, dict) else {}
    )
    if not isinstance(parsed, dict) or not all(
        isinstance(key, str) and entry is not None for key, entry in entries.items()
    ):
        raise _unavailable(
            environment_id,
            f"{source} must be a JSON object of environment id -> executable, or -> "
            '{"python": executable, "build": "the command that builds it"}',
        )
    return {key: entry for key, entry in entries.items() if entry is not None}


def _configured_maps(
    env: Mapping[str, str], environment_id: str
) -> list[dict[str, MappedEnvironment]]:
    """The configured environment maps in resolution order: the inline JSON, then the file."""
    maps: list[dict[str, MappedEnvironment]] = []
    inline = env.get(ENV_MAP_JSON, "").strip()
    if inline:
        maps.append(_parse_map(inline, ENV_MAP_JSON, environment_id))
    map_file = env.get(ENV_MAP_FILE, "").strip()
    if map_file:
        try:
            text = Path(map_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise _unavailable(
                environment_id, f"{ENV_MAP_FILE} {map_file!r} cannot be read: {exc}"
            ) from exc
        maps.append(_parse_map(text, f"{ENV_MAP_FILE} {map_file!r}", environment_id))
    return maps


def _checked_executable(executable: str, environment_id: str, build: str = "") -> str:
    path = Path(executable)
    if not path.is_file() or not os.access(path, os.X_OK):
        how = f": not built here; `{build}` builds it" if build else ""
        raise _unavailable(
            environment_id,
            f"python executable {executable!r} for environment "
            f"{environment_id or DEFAULT_ENVIRONMENT_ID!r} does not exist or is not executable"
            f"{how}",
            **({"build_command": build} if build else {}),
        )
    return executable


def configured_environment_ids(env: Mapping[str, str]) -> list[str]:
    """Every environment id this worker offers, in resolution order: the mapped ids (inline JSON,
    then the file) and the default environment. An unreadable map offers only the default one
    here; resolving any mapped id then fails with the map's problem."""
    ids: list[str] = []
    try:
        for environment_map in _configured_maps(env, DEFAULT_ENVIRONMENT_ID):
            ids.extend(name for name in environment_map if name and name not in ids)
    except GantryError:
        pass
    if DEFAULT_ENVIRONMENT_ID not in ids:
        # "" always resolves (GANTRY_PYTHON_EXECUTABLE, else this interpreter): that is "default".
        ids.append("")
    return ids


def resolve_python(environment_id: str, env: Mapping[str, str]) -> str:
    """The executable for `environment_id`; never falls back to another environment's.

    An empty id is the worker's default environment: GANTRY_PYTHON_EXECUTABLE, else this
    interpreter. A named id must be in a configured map (the inline JSON is consulted before the
    file). "default" is the name the worker's facts, its inventory and the control plane give the
    empty id's environment, so an operator may pass it: it is the default environment too, unless
    a map names "default" itself (then the map's executable, as `configured_environment_ids` offers
    it). That is no fallback: both names mean one environment.
    """
    default_executable = env.get(DEFAULT_EXECUTABLE, "").strip() or sys.executable
    if not environment_id:
        return _checked_executable(default_executable, environment_id)
    environment_maps = _configured_maps(env, environment_id)
    for environment_map in environment_maps:
        if environment_id in environment_map:
            entry = environment_map[environment_id]
            return _checked_executable(entry.python, environment_id, entry.build)
    if environment_id == DEFAULT_ENVIRONMENT_ID:  # no map names it: the empty id's environment
        return _checked_executable(default_executable, environment_id)
    if not environment_maps:
        raise _unavailable(
            environment_id,
            f"runtime environment {environment_id!r} is not configured on this worker "
            f"(set {ENV_MAP_JSON} or {ENV_MAP_FILE})",
        )
    known = sorted({name for environment_map in environment_maps for name in environment_map})
    raise _unavailable(
        environment_id,
        f"runtime environment {environment_id!r} is not in this worker's environment map "
        f"(known: {', '.join(known) or 'none'})",
    )

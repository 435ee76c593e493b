"""What each runtime environment of this worker can run, learned by running a fixed facts script.

Capability labels come from the environment that will run a model, never from the worker's own
interpreter: at start the worker runs `FACTS_SCRIPT` in every configured environment (isolated
`-I`, the model host's allow-listed offline environment, a timeout), all of them concurrently,
and keeps the answers for the life of the process. An interpreter that is missing, or a script
that fails, times out or answers nonsense, makes that environment `available=false` with the
reason; jobs that need it fail RUNTIME_ENVIRONMENT_UNAVAILABLE (class CONFIG), never a fallback.

The script imports torch (for the device facts) only where GPU device nodes exist, and never
sentence-transformers, torchvision or Pillow: whether an adapter is importable is read from the
installed packages without importing them (importing sentence-transformers costs seconds per
environment at every start, and torchvision beside a torch it was not built for fails in C++
registration rather than with an ImportError); the probe proves it for real. An adapter left out
gets a note saying what it lacks ("transformers_trocr needs torchvision (not installed)"), logged
with the environment's facts. The modalities an environment declares are its adapters'.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gantry.common.digests import environment_fingerprint
from gantry.common.errors import GantryError
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.model_host.environments import (
    DEFAULT_ENVIRONMENT_ID,
    configured_environment_ids,
    host_environment,
    resolve_python,
)
from gantry.worker.runtime_adapters.registry import (
    adapter_name,
    registered_adapters,
    runtime_adapter_for,
)

log = logging.getLogger(__name__)

DEFAULT_FACTS_TIMEOUT_S = 120.0
_MAX_OUTPUT_BYTES = 64 * 1024

# Run as `python -I -c FACTS_SCRIPT`; prints one JSON object. Standard library only, plus torch
# when it imports (the device facts). Keep it free of anything the environment may not have.
# It lists the registered runtime adapters (`runtime_adapters`) whose packages it finds; each
# adapter's `collect_runtime_facts` reads its own entry. A new adapter adds its check here.
FACTS_SCRIPT = r"""
import importlib.metadata as metadata
import importlib.util
import json
import os
import platform
import re
import sys

facts = {"versions": {"python": platform.python_version()}, "adapters": [], "notes": []}
for dist in (
    "torch",
    "transformers",
    "sentence-transformers",
    "torchvision",
    "Pillow",
    "llama-cpp-python",
    "vllm",
):
    try:
        facts["versions"][dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
        pass


def package_dirs(name):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    return list(spec.submodule_search_locations or [])


st_dirs = package_dirs("sentence_transformers")
deps = all(package_dirs(name) is not None for name in ("torch", "transformers"))
if st_dirs is not None and deps:
    facts["adapters"].append("sentence_transformers")
    exports_cross_encoder = False
    for directory in st_dirs:
        try:
            with open(os.path.join(directory, "__init__.py"), encoding="utf-8") as handle:
                exports_cross_encoder = exports_cross_encoder or "CrossEncoder" in handle.read()
        except OSError:
            pass
    if exports_cross_encoder:
        facts["adapters"].append("sentence_transformers_cross_encoder")
    else:
        facts["notes"].append("sentence_transformers does not export CrossEncoder")
elif st_dirs is None:
    facts["notes"].append("sentence_transformers is not installed")
else:
    facts["notes"].append("sentence_transformers is installed without torch or transformers")

# transformers_whisper: torch, and a transformers that ships its whisper model package.
transformers_dirs = package_dirs("transformers") or []
has_whisper = any(
    os.path.isdir(os.path.join(directory, "models", "whisper")) for directory in transformers_dirs
)
if package_dirs("torch") is not None and has_whisper:
    facts["adapters"].append("transformers_whisper")
else:
    facts["notes"].append("transformers_whisper needs torch and transformers' whisper models")

# transformers_causal_lm: torch and transformers (AutoModelForCausalLM is in every release).
if package_dirs("torch") is not None and transformers_dirs:
    facts["adapters"].append("transformers_causal_lm")
else:
    facts["notes"].append("transformers_causal_lm needs torch and transformers")

# Managed servers run an executable of this environment, not a model host. llama_cpp_server:
# this interpreter must find the `llama_cpp.server` module and the server extra's packages
# (found, not imported: importing llama_cpp loads the llama.cpp library). vllm_server: the `vllm`
# executable beside this interpreter (sys.executable is the environment's own path, not resolved).
llama_dirs = package_dirs("llama_cpp") or []
server_missing = [
    name for name in ("uvicorn", "fastapi", "sse_starlette", "pydantic_settings")
    if package_dirs(name) is None
]
if not any(os.path.isfile(os.path.join(d, "server", "__main__.py")) for d in llama_dirs):
    facts["notes"].append("llama_cpp_server needs llama-cpp-python's llama_cpp.server module")
elif server_missing:
    facts["notes"].append(
        "llama_cpp_server needs llama-cpp-python[server] (missing %s)" % ", ".join(server_missing)
    )
else:
    facts["adapters"].append("llama_cpp_server")
vllm_executable = os.path.join(os.path.dirname(sys.executable), "vllm")
if os.path.isfile(vllm_executable) and os.access(vllm_executable, os.X_OK):
    facts["adapters"].append("vllm_server")
else:
    facts["notes"].append("vllm_server needs an executable %s" % vllm_executable)


def release(version):
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def torch_mismatch():
    # The torch requirement torchvision's metadata states that the installed torch breaks ("" when
    # met): PyPI's torchvision pins the torch it was built against, and beside another one it
    # fails in C++ operator registration at import, not with an ImportError.
    try:
        requirements = metadata.requires("torchvision") or []
    except metadata.PackageNotFoundError:
        return ""  # importable without metadata (a source tree): the probe will tell
    installed = release(facts["versions"].get("torch", ""))
    for requirement in requirements:
        name, _, marker = requirement.partition(";")
        found = re.match(r"\s*torch(?![\w.-])\s*\(?([^)]*)\)?\s*$", name)
        if found is None or "extra" in marker:
            continue
        for clause in found.group(1).split(","):
            clause = clause.strip()
            op = next((o for o in (">=", "==", "<=", "<", ">") if clause.startswith(o)), None)
            if op is None:
                continue  # "!=", "~=": not how torchvision pins torch
            wanted = release(clause[len(op) :].strip())
            size = max(len(installed), len(wanted))
            have = installed + (0,) * (size - len(installed))
            want = wanted + (0,) * (size - len(wanted))
            met = {
                ">=": have >= want,
                "==": have == want,
                "<=": have <= want,
                "<": have < want,
                ">": have > want,
            }[op]
            if not met:
                return "torch" + clause
    return ""


# The image adapters: torch, torchvision (transformers' image processors need it, built for the
# installed torch) and Pillow (images are decoded with it), and a transformers that ships their
# model packages.
image_modules = (("torch", "torch"), ("torchvision", "torchvision"), ("Pillow", "PIL"))
missing = [dist for dist, module in image_modules if package_dirs(module) is None]
if not transformers_dirs:
    missing.append("transformers")
mismatch = "" if missing else torch_mismatch()
for adapter, model_packages in (
    ("transformers_trocr", ("trocr", "vision_encoder_decoder")),
    ("transformers_siglip2", ("siglip2",)),
):
    unshipped = [
        name
        for name in model_packages
        if not any(os.path.isdir(os.path.join(d, "models", name)) for d in transformers_dirs)
    ]
    if missing:
        facts["notes"].append("%s needs %s (not installed)" % (adapter, ", ".join(missing)))
    elif mismatch:
        facts["notes"].append(
            "%s needs a torchvision built for torch %s (torchvision %s requires %s)"
            % (
                adapter,
                facts["versions"].get("torch", "?"),
                facts["versions"].get("torchvision", "?"),
                mismatch,
            )
        )
    elif unshipped:
        facts["notes"].append(
            "%s needs transformers' %s models (not in transformers %s)"
            % (adapter, ", ".join(unshipped), facts["versions"].get("transformers", "?"))
        )
    else:
        facts["adapters"].append(adapter)

facts["device"] = "cpu"
facts["device_name"] = platform.processor() or platform.machine() or "cpu"
facts["cuda_available"] = False
# Without the driver's device nodes (NVIDIA, or ROCm's) no torch build can see a GPU: say so
# rather than pay seconds for importing torch.
torch = None
if not any(os.path.exists(path) for path in ("/dev/nvidiactl", "/dev/kfd")):
    facts["notes"].append("no GPU device nodes (/dev/nvidiactl, /dev/kfd); torch not imported")
elif "torch" not in facts["versions"]:
    facts["notes"].append("torch is not installed")
else:
    try:
        import torch
    except Exception as exc:
        torch = None
        facts["notes"].append("torch does not import: %s: %s" % (type(exc).__name__, exc))
if torch is not None:
    try:
        if torch.cuda.is_available():
            facts["device"] = "cuda"
            facts["device_name"] = torch.cuda.get_device_name(0)
            facts["cuda_available"] = True
    except Exception as exc:
        facts["notes"].append("torch.cuda failed: %s: %s" % (type(exc).__name__, exc))
print(json.dumps(facts))
"""


def normalized_environment_id(environment_id: str) -> str:
    """The empty id and "default" name one environment in facts, inventory and evidence."""
    return environment_id or DEFAULT_ENVIRONMENT_ID


def unavailable_environment(
    environment_id: str, python_executable: str, reason: str
) -> wg.RuntimeEnvironment:
    return wg.RuntimeEnvironment(
        environment_id=normalized_environment_id(environment_id),
        python_executable=python_executable,
        available=False,
        unavailable_reason=reason,
    )


def environment_from_facts(
    environment_id: str, python_executable: str, facts: object
) -> wg.RuntimeEnvironment:
    """The RuntimeEnvironment a facts script's JSON describes; unavailable when it is malformed."""
    if not isinstance(facts, dict):
        return unavailable_environment(
            environment_id, python_executable, "the facts script printed no JSON object"
        )
    versions = facts.get("versions")
    adapters = facts.get("adapters")
    if not (
        isinstance(versions, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in versions.items())
        and isinstance(adapters, list)
        and all(isinstance(a, str) for a in adapters)
    ):
        return unavailable_environment(
            environment_id, python_executable, "the facts script's JSON lacks versions or adapters"
        )
    # Labels are the registered adapters the environment can run; names it lists that this
    # worker does not know are not labels.
    runnable = [adapter.collect_runtime_facts(facts) for adapter in registered_adapters()]
    runnable = [adapter for adapter in runnable if adapter.available]
    known = [adapter.adapter for adapter in runnable]
    modalities = sorted({m for adapter in runnable for m in adapter.modalities})
    environment = wg.RuntimeEnvironment(
        environment_id=normalized_environment_id(environment_id),
        python_executable=python_executable,
        adapters=sorted(known),
        versions=versions,
        modalities=modalities,
        device=str(facts.get("device") or "cpu"),
        device_name=str(facts.get("device_name") or ""),
        available=True,
    )
    # The one fingerprint function: LoadEvidence, ProbeEvidence and Hello all carry this value.
    environment.fingerprint = environment_fingerprint(environment)
    return environment


async def collect_environment(
    environment_id: str,
    python_executable: str,
    *,
    timeout_s: float = DEFAULT_FACTS_TIMEOUT_S,
    worker_environment: Mapping[str, str] | None = None,
) -> wg.RuntimeEnvironment:
    """Run the facts script with `python_executable`; never raises for the environment's faults."""
    ran = await _run_facts_script(
        python_executable,
        timeout_s=timeout_s,
        worker_environment=worker_environment if worker_environment is not None else os.environ,
    )
    if isinstance(ran, str):
        return unavailable_environment(environment_id, python_executable, ran)
    returncode, stdout, stderr = ran
    if returncode != 0:
        tail = stderr[-_MAX_OUTPUT_BYTES:].decode(errors="replace").strip().splitlines()[-3:]
        return unavailable_environment(
            environment_id,
            python_executable,
            f"the facts script exited with {returncode}: {' | '.join(tail)}",
        )
    lines = stdout[-_MAX_OUTPUT_BYTES:].decode(errors="replace").strip().splitlines()
    try:
        facts = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        facts = None
    environment = environment_from_facts(environment_id, python_executable, facts)
    if environment.available and isinstance(facts, dict) and facts.get("notes"):
        log.info(
            "environment %s (%s): %s",
            environment.environment_id,
            python_executable,
            "; ".join(str(note) for note in facts["notes"]),
        )
    return environment


async def _run_facts_script(
    python_executable: str, *, timeout_s: float, worker_environment: Mapping[str, str]
) -> tuple[int | None, bytes, bytes] | str:
    """The facts script's exit status, stdout and stderr, or why it could not run to its end.
    Its scratch directory is removed, and the script never outlives this call (a timeout or a
    cancellation kills and reaps it)."""
    scratch = Path(tempfile.mkdtemp(prefix="gantry-facts-"))
    try:
        (scratch / "tmp").mkdir(mode=0o700)
        environment = host_environment(
            worker_environment, private_dir=scratch, scratch_dir=scratch / "tmp"
        )
        try:
            process = await asyncio.create_subprocess_exec(
                python_executable,
                "-I",
                "-c",
                FACTS_SCRIPT,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=scratch,
                env=environment,
            )
        except OSError as exc:
            return f"cannot run {python_executable!r}: {exc}"
        try:
            async with asyncio.timeout(timeout_s):
                stdout, stderr = await process.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            return f"the facts script did not finish within {timeout_s:g}s"
        except BaseException:
            # Cancelled with the worker's start: the script must not outlive it.
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return process.returncode, stdout, stderr


@dataclass(frozen=True, kw_only=True)
class _Key:
    environment_id: str
    python_executable: str


class RuntimeEnvironments:
    """The facts of this worker's environments, collected once per process and kept.

    `collect()` runs the script in every configured environment concurrently (the Hello list);
    `require()` answers a job for one environment id, resolving the interpreter the same way the
    model host will and collecting its facts on demand when start-up did not.
    """

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        timeout_s: float = DEFAULT_FACTS_TIMEOUT_S,
    ) -> None:
        self._env = env
        self._timeout_s = timeout_s
        self._facts: dict[_Key, asyncio.Task[wg.RuntimeEnvironment]] = {}
        self._listed: list[_Key] = []
        self._unresolved: dict[str, wg.RuntimeEnvironment] = {}

    async def collect(self) -> list[wg.RuntimeEnvironment]:
        """Every configured environment's facts (concurrently, once); the Hello list."""
        if not self._listed and not self._unresolved:
            for environment_id in configured_environment_ids(self._env):
                try:
                    python = resolve_python(environment_id, self._env)
                except GantryError as error:
                    self._unresolved[environment_id] = unavailable_environment(
                        environment_id, "", error.message
                    )
                    continue
                self._listed.append(_Key(environment_id=environment_id, python_executable=python))
        # Shielded: a cancelled caller must not cancel the run other callers share.
        await asyncio.shield(asyncio.gather(*(self._collected(key) for key in self._listed)))
        return self.listed()

    def listed(self) -> list[wg.RuntimeEnvironment]:
        """What `collect()` learned (empty before it ran), in configuration order."""
        environments: list[wg.RuntimeEnvironment] = []
        for key in self._listed:
            task = self._facts.get(key)
            if task is not None and task.done() and not task.cancelled():
                environments.append(task.result())
        environments.extend(self._unresolved.values())
        return sorted(environments, key=lambda e: e.environment_id)

    async def require(self, environment_id: str, *, adapter: str | None = None) -> RuntimeFacts:
        """The environment a job runs in, or RUNTIME_ENVIRONMENT_UNAVAILABLE (class CONFIG).

        With `adapter`: RUNTIME_INCOMPATIBLE for an adapter this worker does not know, checked
        first; RUNTIME_ENVIRONMENT_UNAVAILABLE when the environment cannot import it.
        """
        if adapter is not None:
            runtime_adapter_for(adapter)  # RUNTIME_INCOMPATIBLE for a name nobody registered
        python = resolve_python(environment_id, self._env)
        key = _Key(
            environment_id=normalized_environment_id(environment_id), python_executable=python
        )
        environment = await asyncio.shield(self._collected(key))
        name = environment.environment_id
        if not environment.available:
            raise GantryError(
                "RUNTIME_ENVIRONMENT_UNAVAILABLE",
                f"runtime environment {name!r} ({python}) is unavailable: "
                f"{environment.unavailable_reason}",
                environment_id=name,
            )
        if adapter is not None and adapter_name(adapter) not in environment.adapters:
            raise GantryError(
                "RUNTIME_ENVIRONMENT_UNAVAILABLE",
                f"adapter {adapter_name(adapter)!r} cannot be imported in runtime environment "
                f"{name!r} ({python}); it has: {', '.join(environment.adapters) or 'none'}",
                environment_id=name,
                adapter=adapter_name(adapter),
            )
        return RuntimeFacts(python_executable=python, environment=environment)

    async def close(self) -> None:
        for task in self._facts.values():
            task.cancel()
        for task in self._facts.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _collected(self, key: _Key) -> asyncio.Task[wg.RuntimeEnvironment]:
        task = self._facts.get(key)
        if task is None or task.cancelled():
            # One task per environment: concurrent jobs wait on the same script run.
            task = asyncio.create_task(
                self._collect_once_per_process(key),
                name=f"environment-facts-{key.environment_id}",
            )
            self._facts[key] = task
        return task

    async def _collect_once_per_process(self, key: _Key) -> wg.RuntimeEnvironment:
        # Keyed by what the script's answer depends on: the interpreter file and the variables
        # the host environment passes on (which accelerators are visible, where libcuda is).
        try:
            stat = os.stat(key.python_executable)
            identity: tuple[object, ...] = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        except OSError:
            identity = ()
        memo_key = (
            key,
            identity,
            self._env.get("CUDA_VISIBLE_DEVICES"),
            self._env.get("LD_LIBRARY_PATH"),
        )
        known = _FACTS_OF_THIS_PROCESS.get(memo_key)
        if known is not None:
            copy = wg.RuntimeEnvironment()
            copy.CopyFrom(known)
            return copy
        environment = await collect_environment(
            key.environment_id,
            key.python_executable,
            timeout_s=self._timeout_s,
            worker_environment=self._env,
        )
        if environment.available:
            # Only answers worth keeping: a failed run is retried by the next agent.
            _FACTS_OF_THIS_PROCESS[memo_key] = environment
        return environment


# Facts of an interpreter hold for the life of this process (a worker process, or a test process
# starting many agents): the script imports torch, which costs seconds per run.
_FACTS_OF_THIS_PROCESS: dict[tuple[object, ...], wg.RuntimeEnvironment] = {}


@dataclass(frozen=True, kw_only=True)
class RuntimeFacts:
    """A resolved, available environment: the interpreter a host starts with and its facts."""

    python_executable: str
    environment: wg.RuntimeEnvironment

    @property
    def fingerprint(self) -> str:
        return self.environment.fingerprint

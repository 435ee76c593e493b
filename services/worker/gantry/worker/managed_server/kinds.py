"""The managed server kinds and the command line of each: built only from typed profile fields.

Invariant: nothing in a server's argv comes from a request or from the artifact's own files but
the verified copy's path; the host is always 127.0.0.1 and the port the one the worker allocated.
A kind names the executable that must exist (else RUNTIME_ENVIRONMENT_UNAVAILABLE), the model
path it is given (the one .gguf file of the verified copy, or the copy's directory) and what it
serves. Pure: no process is started here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2

LOOPBACK_HOST = "127.0.0.1"
LLAMA_CPP_SERVER = "llama_cpp_server"
VLLM_SERVER = "vllm_server"


@dataclass(frozen=True, kw_only=True)
class ServerInputs:
    """Everything a server's argv may depend on; none of it from a request."""

    python_executable: str  # the runtime environment's interpreter (resolved by the worker)
    model_directory: Path  # the verified private copy of the registered artifact set
    port: int  # allocated by the worker on 127.0.0.1
    settings: common_pb2.AdapterSettings  # the runtime profile's typed fields
    served_name: str  # what the server calls the model (the deployment id)


@dataclass(frozen=True, kw_only=True)
class ServerCommand:
    argv: tuple[str, ...]
    executable: str  # argv[0]: must exist and be executable
    model_path: Path


@dataclass(frozen=True, kw_only=True)
class ServerKind:
    name: str
    # Whether /v1/embeddings is served; else an embed is INVALID_PAYLOAD naming the kind.
    serves_embeddings: bool
    # The value of `top_k` that turns top-k sampling off on this server.
    top_k_off: int
    command: Callable[[ServerInputs], ServerCommand]
    # Sent with every completion: the server's own defaults that would change what the payload
    # asked for (llama-cpp-python's API applies repeat_penalty 1.1 and min_p 0.05 unless told).
    neutral_sampling: Mapping[str, Any] = field(default_factory=dict)

    def executable(self, python_executable: str) -> str:
        """The file this kind runs in an environment whose interpreter is `python_executable`."""
        return self.command(
            ServerInputs(
                python_executable=python_executable,
                model_directory=Path("/nonexistent"),
                port=1,
                settings=common_pb2.AdapterSettings(),
                served_name="-",
            )
        ).executable


def gguf_model_file(directory: Path) -> Path:
    """The .gguf file llama.cpp is given: the only one, or the first shard of a split model
    (`-00001-of-000NN.gguf`; llama.cpp finds the others beside it). RUNTIME_INCOMPATIBLE when
    there is none or the choice would be a guess."""
    files = sorted(p for p in directory.rglob("*.gguf") if p.is_file())
    if len(files) == 1:
        return files[0]
    first_shards = [p for p in files if "-00001-of-" in p.name]
    if len(first_shards) == 1:
        return first_shards[0]
    found = ", ".join(str(p.relative_to(directory)) for p in files) or "none"
    raise GantryError(
        "RUNTIME_INCOMPATIBLE",
        f"a llama.cpp server needs exactly one .gguf model (or one split model's first shard) "
        f"in the artifact set; found: {found}",
        adapter=LLAMA_CPP_SERVER,
    )


def _device_layers(device: str) -> str:
    # llama.cpp offloads layers to the GPU it was built for; "cpu" (or empty) keeps them all
    # on the CPU, any CUDA device asks for all of them (-1).
    return "0" if device in ("", "cpu") else "-1"


def llama_cpp_server_command(inputs: ServerInputs) -> ServerCommand:
    settings = inputs.settings
    model = (
        gguf_model_file(inputs.model_directory)
        if inputs.model_directory.exists()
        else inputs.model_directory
    )
    argv = [
        inputs.python_executable,
        "-I",  # no PYTHON* variables, no user site, nothing from the cwd on sys.path
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--model_alias",
        inputs.served_name,
        "--host",
        LOOPBACK_HOST,
        "--port",
        str(inputs.port),
        # 0: the context the model was trained with (AdapterSettings: 0 = model default).
        "--n_ctx",
        str(settings.max_input_length),
        "--n_gpu_layers",
        _device_layers(settings.device),
        # Its default aborts a running generation when another request arrives: callers queue.
        "--interrupt_requests",
        "false",
    ]
    return ServerCommand(argv=tuple(argv), executable=inputs.python_executable, model_path=model)


def vllm_server_command(inputs: ServerInputs) -> ServerCommand:
    settings = inputs.settings
    # vLLM's console script beside the environment's interpreter (bin/vllm of the same venv).
    executable = str(Path(inputs.python_executable).parent / "vllm")
    argv = [
        executable,
        "serve",
        # A directory, never a hub id, so nothing is downloaded; no --trust-remote-code, so no
        # code from the artifact runs (vLLM's default).
        str(inputs.model_directory),
        "--served-model-name",
        inputs.served_name,
        "--host",
        LOOPBACK_HOST,
        "--port",
        str(inputs.port),
    ]
    if settings.max_input_length:
        argv += ["--max-model-len", str(settings.max_input_length)]
    if settings.max_concurrency:
        argv += ["--max-num-seqs", str(settings.max_concurrency)]
    if settings.device in ("", "cpu"):
        argv += ["--device", "cpu"]
    return ServerCommand(argv=tuple(argv), executable=executable, model_path=inputs.model_directory)


SERVER_KINDS: dict[str, ServerKind] = {
    kind.name: kind
    for kind in (
        ServerKind(
            name=LLAMA_CPP_SERVER,
            serves_embeddings=False,  # only with --embedding, which the profile does not set
            top_k_off=0,
            command=llama_cpp_server_command,
            neutral_sampling={"repeat_penalty": 1.0, "min_p": 0.0},
        ),
        ServerKind(
            name=VLLM_SERVER,
            serves_embeddings=False,  # a generation deployment; pooling models are another kind
            top_k_off=-1,
            command=vllm_server_command,
            neutral_sampling={"repetition_penalty": 1.0, "min_p": 0.0},
        ),
    )
}


def server_kind(adapter: str) -> ServerKind | None:
    """The managed server kind an adapter name runs, or None for a model-host adapter."""
    return SERVER_KINDS.get(adapter)

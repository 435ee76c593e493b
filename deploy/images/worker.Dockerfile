# syntax=docker/dockerfile:1.7
# Gantry worker agent image (GPU node). Build from the repository root:
#   docker build -f deploy/images/worker.Dockerfile -t gantry/worker:0.1.0 .
# The worker opens NO listening port: it connects out to the control plane's WorkerGateway and
# runs one model host child process per resident deployment. Only this image carries the ML stack.
ARG PYTHON_IMAGE=python:3.11-slim

# ---- build: generate the gRPC stubs, build a self-contained venv -------------------------------
FROM ${PYTHON_IMAGE} AS build
# torch is pinned to 2.13.0. By default it comes from PyPI (the Linux x86_64 wheel is the CUDA
# build, which is what GPU nodes need). For CPU-only nodes / CI use the CPU wheel index:
#   --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_INDEX_URL=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The code generator lives in its own throwaway venv; it never reaches the runtime stage.
RUN python -m venv /opt/protoc \
 && /opt/protoc/bin/pip install "grpcio-tools==1.85.1" "protobuf>=7.35,<8"
COPY proto/ proto/
COPY libs/ libs/
COPY cli/ cli/
# Generated files are not committed: make them here, exactly as `make proto` does.
RUN /opt/protoc/bin/python -m grpc_tools.protoc -I proto \
      --python_out=libs --pyi_out=libs --grpc_python_out=libs proto/gantry/v1/*.proto
# torch first (from TORCH_INDEX_URL when given), so the [ml] extra below finds it satisfied.
RUN python -m venv /opt/gantry \
 && /opt/gantry/bin/pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==2.13.0"
COPY services/worker/ services/worker/
RUN /opt/gantry/bin/pip install ./libs ./cli "./services/worker[ml]" "torch==2.13.0" \
 && /opt/gantry/bin/python -c "import torch, transformers, sentence_transformers, pynvml, gantry.worker, gantry.v1.worker_gateway_pb2_grpc; assert torch.__version__.split('+')[0] == '2.13.0', torch.__version__"

# ---- runtime ----------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
# tini reaps zombies (model host children) and forwards signals to the worker agent.
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 gantry \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin gantry \
 && mkdir -p /artifacts
COPY --from=build /opt/gantry /opt/gantry
# Offline by construction: the model host never fetches from a hub. Caches point at /tmp, the only
# writable path (read-only root filesystem). NVIDIA_* are read by the NVIDIA container runtime.
ENV PATH=/opt/gantry/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    HF_HUB_DISABLE_PROGRESS_BARS=1 \
    HF_HOME=/tmp/huggingface \
    XDG_CACHE_HOME=/tmp/.cache \
    TOKENIZERS_PARALLELISM=false \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /tmp
USER 10001:10001
# No EXPOSE and no HEALTHCHECK: the worker listens on nothing. Its liveness is its WorkerGateway
# stream, which the control plane observes (heartbeats, leases).
ENTRYPOINT ["tini", "--", "gantry"]
# A model host that cannot reach its whole sandbox is refused (deploy/README.md, "The model host
# sandbox"); deploy/compose.yaml and deploy/k8s pass the same flag.
CMD ["worker", "--control-plane", "controlplane:50051", "--credential-file", "/run/secrets/node.credential", "--artifact-root", "/artifacts", "--require-isolation", "fs-net-seccomp"]

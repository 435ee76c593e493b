# syntax=docker/dockerfile:1.7
# Gantry control plane image. Build from the repository root:
#   docker build -f deploy/images/controlplane.Dockerfile -t gantry/controlplane:0.1.0 .
# Installs gantry-libs, gantry-cli (the `gantry` command) and gantry-controlplane only: no ML stack.
ARG PYTHON_IMAGE=python:3.11-slim

# ---- build: generate the gRPC stubs, build a self-contained venv -------------------------------
FROM ${PYTHON_IMAGE} AS build
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
      --python_out=libs --pyi_out=libs --grpc_python_out=libs proto/gantry/v1/*.proto \
 && /opt/protoc/bin/python -m grpc_tools.protoc -I gantry/kserve=proto/inference \
      --python_out=libs --pyi_out=libs --grpc_python_out=libs proto/inference/*.proto
COPY services/controlplane/ services/controlplane/
RUN python -m venv /opt/gantry \
 && /opt/gantry/bin/pip install ./libs ./cli ./services/controlplane
# Guard: the control plane image must not carry the ML stack (mirrors the import test).
RUN /opt/gantry/bin/python -c "import importlib.util as u, sys; bad = [m for m in ('torch', 'transformers', 'sentence_transformers', 'pynvml') if u.find_spec(m)]; sys.exit('ML stack in control plane image: %s' % bad if bad else 0)" \
 && /opt/gantry/bin/python -c "import gantry.v1.control_plane_pb2_grpc, gantry.kserve.grpc_service_pb2_grpc, gantry.controlplane.app, grpc_health.v1.health_pb2"

# ---- runtime ----------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
# tini reaps zombies and forwards signals to gantry (PID 1 semantics).
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 gantry \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin gantry
COPY --from=build /opt/gantry /opt/gantry
ENV PATH=/opt/gantry/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    GANTRY_HEALTH_TARGET=127.0.0.1:50051
# Runs with a read-only root filesystem; only /tmp is writable (tmpfs / emptyDir).
WORKDIR /tmp
USER 10001:10001
# 50051: gRPC (ControlPlane, Inference, WorkerGateway, the Open Inference Protocol); 8080: the
# OpenAI-compatible HTTP API when started with --http-listen (deploy/compose.yaml does).
EXPOSE 50051 8080
# grpc.health.v1.Health over plaintext. With TLS on the listener, rely on the orchestrator's
# probes instead (or override GANTRY_HEALTH_TARGET to a plaintext health listener).
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import os, sys, grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; r = g.HealthStub(grpc.insecure_channel(os.environ['GANTRY_HEALTH_TARGET'])).Check(h.HealthCheckRequest(), timeout=4); sys.exit(r.status != h.HealthCheckResponse.SERVING)"]
ENTRYPOINT ["tini", "--", "gantry"]
CMD ["controlplane", "--listen", "0.0.0.0:50051"]

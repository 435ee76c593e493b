"""The OpenAI-compatible HTTP API (`/v1/embeddings`, `/v1/completions`, `/v1/chat/completions`,
`/v1/models`): a protocol adapter in front of the Inference servicer, served by the control plane
beside its gRPC server (server.py), with the Open Inference Protocol's REST routes (`/v2/...`,
kserve_routes.py) on the same listener. Below the adapters every call takes the gRPC door's path."""

from gantry.controlplane.serving.openai_http.connections import DoorBounds
from gantry.controlplane.serving.openai_http.server import (
    HttpApi,
    HttpApiSettings,
    HttpListenError,
    start_http_api,
)

__all__ = ["DoorBounds", "HttpApi", "HttpApiSettings", "HttpListenError", "start_http_api"]

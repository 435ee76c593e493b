"""gantry.client: a typed Python client for gantry.v1.Inference (docs/client.md).

    from gantry.client import Client

    with Client("127.0.0.1:50051", key_file=".gantry/client.key") as client:
        vectors = client.embed("minilm", ["Gantry keeps models resident."])  # (1, 384) float32

`Client` blocks; `AsyncClient` has the same methods to await. Both take one address or several
(balanced round robin, with the documented retries), an API key (api_key=, key_file= or
GANTRY_API_KEY), TLS settings and a default deadline; failures raise GantryError subclasses.
"""

from gantry.client.aio import AsyncClient
from gantry.client.blocking import Client
from gantry.client.calls import Generation, Ranked
from gantry.client.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    GantryError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from gantry.client.settings import API_KEY_ENV, DEFAULT_TIMEOUT_S, ClientSettingsError
from gantry.client.vectors import MalformedVectors
from gantry.v1.common_pb2 import Audio, ChatMessage, Image

__all__ = [
    "API_KEY_ENV",
    "DEFAULT_TIMEOUT_S",
    "AsyncClient",
    "Audio",
    "ChatMessage",
    "Client",
    "ClientSettingsError",
    "DeadlineExceeded",
    "FailedPrecondition",
    "GantryError",
    "Generation",
    "Image",
    "InvalidArgument",
    "MalformedVectors",
    "NotFound",
    "PermissionDenied",
    "Ranked",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
]

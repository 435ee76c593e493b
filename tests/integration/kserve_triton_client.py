"""Run by the clients environment's python (tests/fixtures/clients_env.py), never imported by the
tests: tritonclient.grpc against a running Gantry, every answer printed as one JSON document.

    python kserve_triton_client.py ADDRESS API_KEY CAPABILITY TEXT [TEXT ...]
"""

from __future__ import annotations

import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def embed(client, capability: str, texts: list[str], shape: list[int], headers: dict) -> dict:
    tensor = grpcclient.InferInput("text", shape, "BYTES")
    tensor.set_data_from_numpy(
        np.array([t.encode() for t in texts], dtype=np.object_).reshape(shape)
    )
    result = client.infer(
        capability,
        [tensor],
        outputs=[grpcclient.InferRequestedOutput("embedding")],
        headers=headers,
        request_id="kserve-test",
    )
    response = result.get_response()
    vectors = result.as_numpy("embedding")
    return {
        "vectors": vectors.tolist(),
        "dtype": str(vectors.dtype),
        "shape": list(response.outputs[0].shape),
        "datatype": response.outputs[0].datatype,
        "raw": response.raw_output_contents[0].hex(),
        "id": response.id,
        "model_name": response.model_name,
    }


def refusal(call) -> dict:
    try:
        call()
    except InferenceServerException as error:
        return {"status": error.status(), "message": error.message()}
    return {"status": "OK"}


def main() -> None:
    address, key, capability, *texts = sys.argv[1:]
    headers = {"authorization": f"Bearer {key}"}
    client = grpcclient.InferenceServerClient(url=address)
    metadata = client.get_server_metadata(as_json=True)  # open: no key
    model = client.get_model_metadata(capability, headers=headers, as_json=True)
    index = client.get_model_repository_index(headers=headers, as_json=True)
    config = client.get_model_config(capability, headers=headers, as_json=True)
    wrong = {"authorization": "Bearer gk_wrong_key"}
    document = {
        "live": client.is_server_live(),  # open: no key
        "ready": client.is_server_ready(),
        "server": metadata,
        "model_ready": client.is_model_ready(capability, headers=headers),
        "unknown_ready": client.is_model_ready("no-such-capability", headers=headers),
        "model": model,
        "index": index,
        "config": config,
        "flat": embed(client, capability, texts, [len(texts)], headers),
        "column": embed(client, capability, texts, [len(texts), 1], headers),
        "wrong_key": refusal(lambda: client.is_model_ready(capability, headers=wrong)),
        "wrong_key_infer": refusal(lambda: embed(client, capability, texts, [len(texts)], wrong)),
        "unknown_model": refusal(lambda: embed(client, "no-such", texts, [len(texts)], headers)),
        # After the two embeds above: this replica's tally, as the client parses it.
        "stats": client.get_inference_statistics(capability, headers=headers, as_json=True),
        "not_served": refusal(lambda: client.unregister_system_shared_memory(headers=headers)),
    }
    print(json.dumps(document))


if __name__ == "__main__":
    main()

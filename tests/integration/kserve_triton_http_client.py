"""Run by the clients environment's python (tests/fixtures/clients_env.py), never imported by the
tests: tritonclient.http against a running Gantry's HTTP port, every answer printed as one JSON
document.

    python kserve_triton_http_client.py HOST:PORT API_KEY EMBED_CAPABILITY RERANK_CAPABILITY \
        QUERY TEXT [TEXT ...]
"""

from __future__ import annotations

import json
import sys

import numpy as np
import tritonclient.http as httpclient

# Beside this script, so on its path when run: the gRPC client script's way of reading a refusal.
from kserve_triton_client import refusal


def texts_input(name: str, texts: list[str], *, binary: bool) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_), binary)
    return tensor


def embed(client, capability: str, texts: list[str], headers: dict, *, binary: bool) -> dict:
    # A copy: tritonclient.http's infer adds Inference-Header-Content-Length to the dict it is
    # given, and a later call with that dict would send the stale length.
    result = client.infer(
        capability,
        [texts_input("text", texts, binary=binary)],
        outputs=[httpclient.InferRequestedOutput("embedding", binary_data=binary)],
        headers=dict(headers),
        request_id="rest-test",
    )
    response = result.get_response()
    vectors = result.as_numpy("embedding")
    return {
        "vectors": vectors.tolist(),
        "dtype": str(vectors.dtype),
        "output": response["outputs"][0],
        "id": response.get("id"),
        "model_name": response["model_name"],
        "parameters": response.get("parameters"),
    }


def rerank(client, capability: str, query: str, documents: list[str], headers: dict) -> dict:
    result = client.infer(
        capability,
        [
            texts_input("query", [query], binary=True),
            texts_input("documents", documents, binary=False),
        ],
        headers=dict(headers),  # no outputs named: every output binary
    )
    scores = result.as_numpy("scores")
    return {"scores": scores.tolist(), "dtype": str(scores.dtype)}


def main() -> None:
    address, key, capability, reranker, query, *texts = sys.argv[1:]
    headers = {"Authorization": f"Bearer {key}"}
    wrong = {"Authorization": "Bearer gk_wrong_key"}
    client = httpclient.InferenceServerClient(url=address)
    document = {
        "live": client.is_server_live(),  # open: no key
        "ready": client.is_server_ready(),
        "server": client.get_server_metadata(),
        "model_ready": client.is_model_ready(capability, headers=headers),
        "unknown_ready": client.is_model_ready("no-such-capability", headers=headers),
        "model": client.get_model_metadata(capability, headers=headers),
        "versioned": client.get_model_metadata(capability, model_version="1", headers=headers),
        "config": client.get_model_config(capability, headers=headers),
        "index": client.get_model_repository_index(headers=headers),
        "binary": embed(client, capability, texts, headers, binary=True),
        "json": embed(client, capability, texts, headers, binary=False),
        "rerank": rerank(client, reranker, query, texts, headers),
        "wrong_key": refusal(lambda: client.get_model_metadata(capability, headers=wrong)),
        "wrong_key_infer": refusal(lambda: embed(client, capability, texts, wrong, binary=True)),
        "unknown_model": refusal(lambda: embed(client, "no-such", texts, headers, binary=True)),
        "bad_tensor": refusal(
            lambda: client.infer(
                capability, [texts_input("txt", texts, binary=True)], headers=headers
            )
        ),
        "not_served": refusal(lambda: client.load_model(capability, headers=headers)),
        # After the embeds above: this replica's tally, as the client reads it.
        "stats": client.get_inference_statistics(capability, headers=headers),
        "all_stats": client.get_inference_statistics(headers=headers),
    }
    print(json.dumps(document))


if __name__ == "__main__":
    main()

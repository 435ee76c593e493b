"""Run by the clients environment's python (tests/fixtures/clients_env.py), never imported by the
tests: tritonclient.grpc's decoupled streaming (ModelStreamInfer) against a running Gantry, one
generation streamed and then a refused request on the same stream, printed as one JSON document.

    python kserve_triton_stream_client.py ADDRESS API_KEY CAPABILITY PROMPT MAX_TOKENS
"""

from __future__ import annotations

import json
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient

WAIT_S = 120


def main() -> None:
    address, key, capability, prompt, max_tokens = sys.argv[1:]
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url=address)
    client.start_stream(
        callback=lambda result, error: results.put((result, error)),
        headers={"authorization": f"Bearer {key}"},
    )
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    limit = grpcclient.InferInput("max_tokens", [1], "INT32")
    limit.set_data_from_numpy(np.array([int(max_tokens)], dtype=np.int32))
    client.async_stream_infer(capability, [text, limit], request_id="streamed")
    chunks, finish, parameters = [], None, {}
    while finish is None:
        result, error = results.get(timeout=WAIT_S)
        if error is not None:
            raise error
        response = result.get_response()
        chunks.append(result.as_numpy("text_output")[0].decode())
        if response.parameters["triton_final_response"].bool_param:
            finish = result.as_numpy("finish_reason")[0].decode()
            parameters = {key: value.string_param for key, value in response.parameters.items()}
    wrong = grpcclient.InferInput("prompt", [1], "BYTES")
    wrong.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
    client.async_stream_infer(capability, [wrong], request_id="refused")
    _, refused = results.get(timeout=WAIT_S)
    client.stop_stream()
    document = {
        "chunks": chunks,
        "finish": finish,
        "id": response.id,
        "parameters": parameters,
        "refused": None if refused is None else refused.message(),
    }
    print(json.dumps(document))


if __name__ == "__main__":
    main()

"""A stand-in replica of the Inference front door in a process of its own, so that a test can
SIGKILL it with calls in flight (tests/integration/test_client_replicas.py).

`python replica_server.py NAME HOLD_AFTER` prints `port N` once it serves, then answers each
Embed with NAME in `node_id` and the call's first input in `deployment_id`. From call number
HOLD_AFTER on (a negative number: never) it prints `held ID` and never answers: those calls are
in flight when the test kills it, and only a retry on another replica can answer them.
"""

from __future__ import annotations

import asyncio
import sys

import grpc

from gantry.common.grpc_server import SERVER_OPTIONS
from gantry.v1 import inference_pb2, inference_pb2_grpc


class HoldingInference(inference_pb2_grpc.InferenceServicer):
    def __init__(self, name: str, hold_after: int) -> None:
        self.name = name
        self.hold_after = hold_after
        self.calls = 0
        self.never = asyncio.Event()  # never set: a held call waits for the kill

    async def Embed(
        self, request: inference_pb2.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EmbedResponse:
        self.calls += 1
        call_id = request.inputs[0] if request.inputs else ""
        if 0 <= self.hold_after < self.calls:
            print(f"held {call_id}", flush=True)
            await self.never.wait()
        return inference_pb2.EmbedResponse(deployment_id=call_id, node_id=self.name)


async def serve(name: str, hold_after: int) -> None:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    inference_pb2_grpc.add_InferenceServicer_to_server(HoldingInference(name, hold_after), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"port {port}", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], int(sys.argv[2])))

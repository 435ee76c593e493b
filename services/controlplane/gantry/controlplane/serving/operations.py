"""Each inference operation bound to its control-plane behaviour, keyed by the registry.

`gantry.common.operations` declares the operations; this module says, for each, how the control
plane turns a client's request into a worker payload: its checks (`*_validation`, raising the
client's error before anything is scheduled), the work's cost for the fair queue (`work_cost`),
its span's attributes, and how the worker's result is checked and shaped into the client's
response (`*_answers`). `InferenceService` serves every entry of `PREPARED` the same way (resolve,
dispatch, invoke, answer); an operation whose call has more steps than that (a generation, whose
max_tokens depends on the deployment, and whose stream writes as it goes) is served by its own
handler instead (`generation_inference`), named in `HANDLED_ELSEWHERE`. Every registered operation
is exactly one of the two (`check_bound`).

The other front doors map onto these RPCs by the kind of deployment, not by operation (KServe v2:
`kserve/mappings.py`, one tensor mapping per adapter kind; the OpenAI-compatible API:
`openai_http/routes.py`) and call InferenceService's methods, so each inherits an operation's
checks, cost and answer from here; an operation with no equivalent there needs no mapping.
"""

from __future__ import annotations

from collections.abc import Mapping

from gantry.common import operations
from gantry.common.inference_limits import InferenceLimits
from gantry.controlplane.serving import media_inference
from gantry.controlplane.serving.inference_validation import validate_inputs, validate_rerank
from gantry.controlplane.serving.prepared_call import Prepare, PreparedCall
from gantry.controlplane.serving.text_answers import embedding_response, ranked
from gantry.controlplane.serving.work_cost import embed_cost, rerank_cost
from gantry.v1 import inference_pb2
from gantry.v1 import worker_gateway_pb2 as wg


def prepare_embed(request: inference_pb2.EmbedRequest, limits: InferenceLimits) -> PreparedCall:
    inputs = list(request.inputs)
    validate_inputs(inputs, limits)
    return PreparedCall(
        payload=wg.EmbedPayload(inputs=inputs, truncate=request.truncate),
        cost=embed_cost(inputs),
        attributes={},
        answer=lambda result: embedding_response(
            result.embed, request.encoding, inputs=len(inputs)
        ),
    )


def prepare_rerank(request: inference_pb2.RerankRequest, limits: InferenceLimits) -> PreparedCall:
    documents = list(request.documents)
    validate_rerank(request.query, documents, limits)
    # Whether the deployment's adapter reranks is its model host's to say: a rerank sent to an
    # embedding deployment comes back INVALID_PAYLOAD, as the client's error.
    return PreparedCall(
        payload=wg.RerankPayload(
            query=request.query, documents=documents, truncate=request.truncate
        ),
        cost=rerank_cost(request.query, documents),
        attributes={"gantry.document_count": len(documents)},
        answer=lambda result: inference_pb2.RerankResponse(
            results=ranked(list(result.rerank.scores), request.top_n, documents=len(documents))
        ),
    )


# The operations served by InferenceService's one unary path, by RPC.
PREPARED: Mapping[str, Prepare] = {
    operations.EMBED.rpc: prepare_embed,
    operations.RERANK.rpc: prepare_rerank,
    operations.TRANSCRIBE.rpc: media_inference.prepare_transcribe,
    operations.RECOGNIZE_TEXT.rpc: media_inference.prepare_recognize_text,
    operations.EMBED_IMAGE.rpc: media_inference.prepare_embed_image,
    operations.CLASSIFY_IMAGE.rpc: media_inference.prepare_classify_image,
}
# The operations with a handler of their own (generation_inference.py).
HANDLED_ELSEWHERE = frozenset({operations.GENERATE.rpc, operations.GENERATE_STREAM.rpc})


def check_bound() -> None:
    """Every registered operation is served one way, and nothing unregistered is: raised at
    import, so a half-added operation fails every test that imports the control plane."""
    registered = set(operations.BY_RPC)
    bound = set(PREPARED) | HANDLED_ELSEWHERE
    if registered != bound or set(PREPARED) & HANDLED_ELSEWHERE:
        raise RuntimeError(
            f"operations without control-plane behaviour: {sorted(registered - bound)}; "
            f"bound but not registered: {sorted(bound - registered)}",
        )


check_bound()

"""A call's cost for the fair queue and budgets: bytes of UTF-8 text, at least 1."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gantry.common.clock import ManualClock
from gantry.controlplane.serving.inference_service import CallBudget, InferenceService, work_cost
from gantry.controlplane.serving.route_cache import RouteCache
from gantry.controlplane.serving.work_cost import embed_cost, rerank_cost
from gantry.v1 import inference_pb2, scheduler_pb2
from gantry.v1 import worker_gateway_pb2 as wg


def test_an_embed_costs_the_bytes_of_all_its_inputs():
    assert embed_cost(["abc", "de"]) == 5


def test_text_is_counted_in_utf8_bytes_not_characters():
    assert embed_cost(["é"]) == 2
    assert embed_cost(["日本"]) == 6
    assert embed_cost(["🙂"]) == 4


def test_an_empty_text_still_costs_one():
    assert embed_cost([""]) == 1
    assert embed_cost([]) == 1
    assert rerank_cost("", [""]) == 1


def test_a_rerank_counts_the_query_once_per_document():
    # query 3 bytes x 2 documents + documents 4 + 1 bytes
    assert rerank_cost("abc", ["wxyz", "v"]) == 3 * 2 + 5


def test_the_payload_decides_which_rule_applies():
    assert work_cost(wg.EmbedPayload(inputs=["abc", "de"])) == 5
    assert work_cost(wg.RerankPayload(query="abc", documents=["wxyz", "v"])) == 11


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=50), max_size=20), st.text(max_size=50))
def test_cost_is_positive_and_grows_with_more_text(inputs: list[str], extra: str):
    assert embed_cost(inputs) >= 1
    assert embed_cost([*inputs, extra]) >= embed_cost(inputs)
    assert rerank_cost(extra, inputs) >= 1


class _SchedulerLink:
    """The two calls `_invoke` makes of the scheduler link, recorded."""

    def __init__(self) -> None:
        self.submitted: list[scheduler_pb2.WorkSubmitted] = []
        self.finished: list[int] = []

    async def dispatch(
        self, work: scheduler_pb2.WorkSubmitted, *, timeout: float
    ) -> scheduler_pb2.Dispatch:
        self.submitted.append(work)
        return scheduler_pb2.Dispatch(work_id=work.work_id, node_id="n1", residency_id="r1")

    def work_finished(self, work_id: str, outcome: int, *, reason: str = "") -> None:
        self.finished.append(outcome)


class _Hub:
    async def invoke(self, **_: object) -> wg.InvokeResult:
        return wg.InvokeResult(rerank=wg.RerankResult(scores=[0.5, 0.25]))


async def test_submitted_work_carries_its_cost_and_the_call_budget():
    link = _SchedulerLink()
    service = InferenceService(
        database=None,  # type: ignore[arg-type]  # `_invoke` reads nothing stored
        hub=_Hub(),  # type: ignore[arg-type]
        scheduler=link,  # type: ignore[arg-type]
        routes=RouteCache(ManualClock()),
        clock=ManualClock(),
    )
    request = inference_pb2.RerankRequest(capability="rank", query="ab", documents=["xyz", "é"])
    node_id, _ = await service._invoke(
        tenant_id="tenant-a",
        deployment_id="d1",
        request=request,
        payload=wg.RerankPayload(query=request.query, documents=list(request.documents)),
        budget=CallBudget(seconds=12.5, client_bounded=True),
        answer=lambda result: result,
    )
    [work] = link.submitted
    assert node_id == "n1"
    assert work.cost == 2 * 2 + 3 + 2
    assert work.timeout_seconds == 12.5
    assert link.finished == [scheduler_pb2.WORK_OUTCOME_SUCCESS]

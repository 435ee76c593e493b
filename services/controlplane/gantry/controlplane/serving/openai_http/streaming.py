"""A GenerateStream call as server-sent events in OpenAI's chunk format, ending `data: [DONE]`.

The handler (InferenceService.GenerateStream, unchanged) runs as its own task and writes its
chunks into the call's bounded queue (front_door.HttpCallContext); the response reads them from
there. Until the first chunk the call can still fail with a status (404, 429, ...); after it the
status is 200 and a failure is one last `data: {"error": ...}` event, which the OpenAI SDKs raise.
A client that goes away cancels the handler task wherever it waits, as gRPC cancels it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from gantry.common.errors import GantryError
from gantry.controlplane.serving.openai_http.errors import http_error
from gantry.controlplane.serving.openai_http.front_door import HttpCallContext
from gantry.controlplane.serving.openai_http.responses import (
    Completion,
    chunk_body,
    sse,
    stream_events,
)

log = logging.getLogger(__name__)


async def next_chunk(context: HttpCallContext, task: asyncio.Future[None]) -> Any | None:
    """The handler's next chunk, in order; None once it has returned and every chunk was read.
    Its failure is raised here, after the chunks it wrote before failing."""
    chunks = context.chunks
    if chunks.empty() and not task.done():
        getter = asyncio.ensure_future(chunks.get())
        try:
            await asyncio.wait((getter, task), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
    if not chunks.empty():
        return chunks.get_nowait()
    task.result()  # done: raises its failure, if any
    return None


async def cancel(task: asyncio.Future[None]) -> None:
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def stream_events_of(
    *,
    completion: Completion,
    first: Any,
    context: HttpCallContext,
    task: asyncio.Future[None],
    include_usage: bool,
    finished: Callable[[BaseException | None], None],
) -> AsyncIterator[bytes]:
    """Every event of one stream, from its first chunk (already read) to `[DONE]` or the error
    event; `finished` hears how it ended, once, whatever ends it (a client gone included)."""
    error: BaseException | None = None
    try:
        if completion.chat:
            yield sse(chunk_body(completion, role=True))
        chunk = first
        while chunk is not None:
            for event in stream_events(completion, chunk, include_usage=include_usage):
                yield event
            chunk = await next_chunk(context, task)
    except GantryError as failure:
        error = failure
        yield sse(http_error(failure).body)
    except Exception as failure:
        log.exception("unexpected failure in a streamed completion", exc_info=failure)
        error = GantryError("INTERNAL", f"internal error in a stream ({type(failure).__name__})")
        yield sse(http_error(error).body)
    except BaseException as failure:  # cancelled: the client went away, or the server stops
        error = failure
        raise
    finally:
        await cancel(task)
        finished(error)

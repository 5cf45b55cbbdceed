"""sie.v1.Worker: the gateway's stream into this worker.

A gateway keeps one Work stream per worker and multiplexes requests on it by
request_id. Each request runs as soon as it arrives, bounded by its own
timeout (at most SIE_MAX_REQUEST_TIMEOUT_S), and is answered as it completes; a CancelWork drops it unanswered.
Each request runs in a server span that continues the trace its
`trace_context` names (the stream itself is not traced).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc
from opentelemetry import trace

from sie.v1 import worker_pb2, worker_pb2_grpc
from sie_common.edge.concurrent_answers import ConcurrentAnswers
from sie_common.edge.errors import DeadlineExceeded, InvalidArgument, SieError, Unimplemented
from sie_common.runtime.tracing import WORK_METHOD, extract, span
from sie_worker.api.convert import work_timeout
from sie_worker.engine.limits import Limits
from sie_worker.metrics import WORK_STREAMS

# Task name in WorkRequest ("encode", "score", "extract") -> the API call that serves it.
Handler = Callable[[Any], Awaitable[Any]]


class WorkService(worker_pb2_grpc.WorkerServicer):
    def __init__(self, handlers: Mapping[str, Handler], worker_id: str, limits: Limits) -> None:
        self._handlers = dict(handlers)
        self._worker_id = worker_id
        self._limits = limits

    async def Work(
        self, requests: AsyncIterator[worker_pb2.WorkRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.WorkResponse]:
        WORK_STREAMS.inc()
        answers: ConcurrentAnswers[worker_pb2.WorkResponse] = ConcurrentAnswers()

        async def feed() -> None:
            async for work in requests:
                task = work.WhichOneof("task")
                if task == "cancel":
                    answers.cancel(work.request_id)
                elif not work.request_id:
                    answers.reply(
                        self._failed(work, InvalidArgument("request_id is required", reason="MISSING_REQUEST_ID"))
                    )
                elif not answers.start(work.request_id, self._answer(work)):
                    duplicate = InvalidArgument(
                        f"request_id {work.request_id!r} is already in flight on this stream",
                        reason="DUPLICATE_REQUEST_ID",
                    )
                    answers.reply(self._failed(work, duplicate))

        async for response in answers.stream(feed()):
            yield response

    async def _answer(self, work: worker_pb2.WorkRequest) -> worker_pb2.WorkResponse:
        task = work.WhichOneof("task")
        parent = extract(work.trace_context) if work.trace_context else None
        with span(
            f"{WORK_METHOD} {task}", context=parent, kind=trace.SpanKind.SERVER, attributes={"sie.task": task or ""}
        ):
            return await self._run(work, task)

    async def _run(self, work: worker_pb2.WorkRequest, task: str | None) -> worker_pb2.WorkResponse:
        handler = self._handlers.get(task or "")
        try:
            if handler is None or task is None:
                raise Unimplemented(f"this worker does not serve {task or 'empty'} work", reason="TASK_NOT_SERVED")
            timeout = work_timeout(work.timeout, self._limits) if work.HasField("timeout") else None
            try:
                async with asyncio.timeout(timeout):
                    response = await handler(getattr(work, task))
            except TimeoutError:
                raise DeadlineExceeded(
                    f"request {work.request_id} did not finish within its {timeout:.3f} s", reason="DEADLINE_EXCEEDED"
                ) from None
        except SieError as error:
            return self._failed(work, error)
        return worker_pb2.WorkResponse(request_id=work.request_id, worker_id=self._worker_id, **{task: response})

    def _failed(self, work: worker_pb2.WorkRequest, error: SieError) -> worker_pb2.WorkResponse:
        return worker_pb2.WorkResponse(request_id=work.request_id, worker_id=self._worker_id, error=error.to_status())

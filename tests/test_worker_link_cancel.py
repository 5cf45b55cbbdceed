"""A gateway's link to a worker closed by a task that is cancelled meanwhile: the task stays cancelled.

The gateway's etcd mirror of the workers closes the link of a worker that deregistered from inside its own task.
The gateway's shutdown cancels that task and waits for it: a close that took the cancellation for its stream
reader's own left the mirror following etcd, and the gateway waited for it until it was killed (40 s in the suite's
teardowns, where a worker and its gateway stop together). In-process: a real grpc.aio server whose Work never
answers stands in for the worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from sie.v1 import inference_pb2, types_pb2, worker_pb2_grpc
from sie_gateway.worker_link import WorkerLink


class SilentWorker(worker_pb2_grpc.WorkerServicer):
    """Reads every request of a Work stream and answers none."""

    def __init__(self) -> None:
        self.received = asyncio.Event()

    async def Work(self, request_iterator, context):  # type: ignore[no-untyped-def]
        async for _ in request_iterator:
            self.received.set()
        return
        yield


@pytest.fixture
async def silent_worker() -> AsyncIterator[tuple[str, SilentWorker]]:
    server = grpc.aio.server()
    servicer = SilentWorker()
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}", servicer
    await server.stop(None)


async def test_a_close_whose_task_is_cancelled_raises_cancelled_error(silent_worker) -> None:
    address, servicer = silent_worker
    link = WorkerLink("w", address, window=2)
    request = inference_pb2.EncodeRequest(model="m", items=[types_pb2.Item(text="never answered")])
    waiting = asyncio.ensure_future(link.call("encode", request, timeout_s=30))
    await asyncio.wait_for(servicer.received.wait(), timeout=10)  # the Work stream is open
    closing = asyncio.ensure_future(link.close())
    await asyncio.sleep(0)  # the close has cancelled the call and waits for the stream's reader to end
    assert not closing.done()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert closing.cancelled()
    await link.close()  # a second close finishes the job
    waiting.cancel()
    with pytest.raises((asyncio.CancelledError, Exception)):
        await waiting

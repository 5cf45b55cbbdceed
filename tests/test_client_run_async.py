"""SIEClient.run_async, which the integrations' async methods use: a caller's cancellation reaches the server (the
call on the client's own loop is cancelled, not left running), the client serves on afterwards, and a closed client
says so."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_client import SIEClient

MODEL = "test/tiny-mean"


class _Waiting(inference_pb2_grpc.InferenceServicer):
    """An Inference server whose Encode waits until its caller goes away, and says when that happened."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.caller_gone = threading.Event()

    def Encode(self, request, context):
        self.started.set()
        while context.is_active():
            threading.Event().wait(0.05)
        self.caller_gone.set()
        return inference_pb2.EncodeResponse()


@pytest.fixture
def waiting() -> Iterator[tuple[str, _Waiting]]:
    servicer = _Waiting()
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(grace=None)


async def test_cancelling_the_caller_cancels_the_call(waiting, worker) -> None:
    address, servicer = waiting
    with SIEClient(address, read_timeout_s=60) as client:
        task = asyncio.create_task(client.run_async(lambda engine: engine.encode(MODEL, "hello")))
        assert await asyncio.to_thread(servicer.started.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(servicer.caller_gone.wait, 10), "the call went on after its caller left"
    with SIEClient(worker.address) as client:  # and a client serves on after a cancelled call
        task = asyncio.create_task(client.run_async(lambda engine: engine.encode(MODEL, ["a"] * 600)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        result = await client.run_async(lambda engine: engine.encode(MODEL, "hello"))
        assert result["dense"].shape == (32,)


def test_a_closed_client_says_so(worker) -> None:
    client = SIEClient(worker.address)
    client.close()
    with pytest.raises(RuntimeError, match=r"^this SIEClient is closed; make a new one$"):
        client.encode(MODEL, "hello")

    async def awaited() -> None:
        await client.run_async(lambda engine: engine.encode(MODEL, "hello"))

    with pytest.raises(RuntimeError, match=r"^this SIEClient is closed; make a new one$"):
        asyncio.run(awaited())


def test_closing_the_client_mid_call_answers_its_blocking_caller(waiting) -> None:
    """close() from another thread while a call waits on the server: the caller gets an error that says so (not a
    call left on a stopped loop, which would never answer), and the server sees the call go."""
    address, servicer = waiting
    client = SIEClient(address, read_timeout_s=60)
    raised: list[Exception] = []

    def call() -> None:
        try:
            client.encode(MODEL, "hello")
        except Exception as error:  # noqa: BLE001 (whatever it is, the assertion below names it)
            raised.append(error)

    caller = threading.Thread(target=call, daemon=True)  # a daemon: a caller that hangs fails the test, not the run
    caller.start()
    assert servicer.started.wait(30)
    client.close()
    caller.join(10)
    assert not caller.is_alive(), "the blocking caller still waits after close()"
    assert [(type(error), str(error)) for error in raised] == [
        (RuntimeError, "this SIEClient was closed while the call was in flight")
    ]
    assert servicer.caller_gone.wait(10)


async def test_closing_the_client_mid_call_answers_its_async_caller(waiting) -> None:
    address, servicer = waiting
    client = SIEClient(address, read_timeout_s=60)
    task = asyncio.create_task(client.run_async(lambda engine: engine.encode(MODEL, "hello")))
    assert await asyncio.to_thread(servicer.started.wait, 30)
    await asyncio.to_thread(client.close)
    with pytest.raises(RuntimeError, match=r"^this SIEClient was closed while the call was in flight$"):
        await asyncio.wait_for(task, 10)
    assert await asyncio.to_thread(servicer.caller_gone.wait, 10)

"""One long-lived sie.v1.Worker/Work stream from the gateway to one worker.

Requests are multiplexed on the stream by request id; at most `window` are
in flight, the rest wait for a slot. When the stream breaks, every request in
flight on it fails with WorkerLost at once (inference is idempotent, so the
caller may retry elsewhere) and the next call opens a new stream. Once the
link is closed (the worker left the registry), the calls still waiting for a
slot fail with WorkerLost too (they used to open a stream on the closed
channel, which raised grpc's UsageError: the caller got UNKNOWN instead of
being sent to another worker). Each
request has its own client span and carries its trace context to the worker.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace

from sie.v1 import worker_pb2, worker_pb2_grpc
from sie_common.edge.auth import PresentToken
from sie_common.runtime.settings import SettingsError
from sie_common.runtime.tracing import WORK_METHOD, inject, span
from sie_common.runtime.transport import RECONNECT_OPTIONS, channel_credentials
from sie_gateway.settings import GatewaySettings

log = logging.getLogger(__name__)

WORKER_SERVICE = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name


class WorkerLost(Exception):
    """The worker's stream ended before it answered; the request may be retried elsewhere."""


class _Stream:
    """One open Work call: its outgoing queue, its reader, and the requests awaiting answers."""

    def __init__(self, stub: worker_pb2_grpc.WorkerStub) -> None:
        self.outgoing: asyncio.Queue[worker_pb2.WorkRequest | None] = asyncio.Queue()
        self.pending: dict[str, asyncio.Future[worker_pb2.WorkResponse]] = {}
        self.call = stub.Work(self._requests())
        self.reader = asyncio.create_task(self._read())

    async def _requests(self) -> AsyncIterator[worker_pb2.WorkRequest]:
        while (request := await self.outgoing.get()) is not None:
            yield request

    async def _read(self) -> None:
        error: grpc.aio.AioRpcError | None = None
        try:
            async for response in self.call:
                future = self.pending.pop(response.request_id, None)
                if future is not None and not future.done():
                    future.set_result(response)
        except grpc.aio.AioRpcError as rpc_error:
            error = rpc_error
        finally:
            lost = WorkerLost(f"work stream ended: {error.code().name if error else 'closed by the worker'}")
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(lost)
            self.pending.clear()

    @property
    def broken(self) -> bool:
        return self.reader.done()

    async def close(self) -> None:
        self.outgoing.put_nowait(None)
        self.call.cancel()
        # Wait for the reader without taking a cancellation of this task for the reader's own: the workers' mirror
        # closes links from its task, and the gateway's shutdown cancels that task and waits for it to end.
        await asyncio.wait([self.reader])


# address -> a channel to that worker (plaintext, or TLS as the gateway's settings say).
Connect = Callable[[str], grpc.aio.Channel]


def worker_connector(settings: GatewaySettings) -> Connect:
    """Channels to workers: TLS when SIE_WORKER_TLS_CA_FILE is set, presenting SIE_WORKER_TLS_CERT_FILE
    (mutual TLS) when that is set too, and SIE_WORKER_TOKEN on every Work stream when that is set.
    A worker's answer is bounded by the worker's own send limit; receiving any size keeps one over this
    gateway's limit from ending the whole Work stream (the gateway answers that request
    RESOURCE_EXHAUSTED instead)."""
    options = [
        ("grpc.max_receive_message_length", -1),
        ("grpc.max_send_message_length", -1),
        *RECONNECT_OPTIONS.items(),  # a restarted worker gets calls again within a second of listening
    ]
    interceptors = [PresentToken(settings.worker_token)] if settings.worker_token else None
    if not settings.worker_tls_ca_file:
        if settings.worker_tls_cert_file:
            raise SettingsError("SIE_WORKER_TLS_CERT_FILE (mutual TLS to workers) needs SIE_WORKER_TLS_CA_FILE")
        return lambda address: grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    credentials = channel_credentials(
        settings.worker_tls_ca_file, settings.worker_tls_cert_file, settings.worker_tls_key_file
    )
    return lambda address: grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)


class WorkerLink:
    def __init__(self, worker_id: str, address: str, *, window: int, channel: grpc.aio.Channel | None = None) -> None:
        self.worker_id = worker_id
        self.address = address
        self.window = window
        self._channel = channel or grpc.aio.insecure_channel(address)
        self._stub = worker_pb2_grpc.WorkerStub(self._channel)
        self._slots = asyncio.Semaphore(window)
        self._stream: _Stream | None = None
        self._ids = itertools.count()
        self._closed = False
        self.outstanding = 0  # calls sent (at most `window`)
        self._calls = 0  # calls sent or waiting for a slot
        self._quiet = asyncio.Event()  # set while there are none
        self._quiet.set()

    async def call(self, task: str, message: Any, *, timeout_s: float | None) -> worker_pb2.WorkResponse:
        """Send one request ("encode", "score", "extract") and wait for its answer.

        `timeout_s` travels with the request, so the worker stops when the
        caller's deadline passes; raises WorkerLost when the stream breaks.
        """
        self._calls += 1
        self._quiet.clear()
        try:
            async with self._slots:
                self.outstanding += 1
                try:
                    return await self._exchange(task, message, timeout_s)
                finally:
                    self.outstanding -= 1
        finally:
            self._calls -= 1
            if not self._calls:
                self._quiet.set()

    async def _exchange(self, task: str, message: Any, timeout_s: float | None) -> worker_pb2.WorkResponse:
        stream = self._open_stream()
        request_id = str(next(self._ids))
        request = worker_pb2.WorkRequest(request_id=request_id, **{task: message})
        if timeout_s is not None:
            request.timeout.FromNanoseconds(int(timeout_s * 1e9))
        future: asyncio.Future[worker_pb2.WorkResponse] = asyncio.get_running_loop().create_future()
        with span(f"{WORK_METHOD} {task}", kind=trace.SpanKind.CLIENT, attributes={"sie.worker_id": self.worker_id}):
            inject(request.trace_context)
            stream.pending[request_id] = future
            stream.outgoing.put_nowait(request)
            try:
                return await future
            finally:
                if not future.done() and not stream.broken:
                    stream.pending.pop(request_id, None)
                    stream.outgoing.put_nowait(
                        worker_pb2.WorkRequest(request_id=request_id, cancel=worker_pb2.CancelWork())
                    )

    async def serving(self, timeout_s: float) -> bool:
        """Whether the worker's health check says sie.v1.Worker is SERVING (a restarted worker says so once its
        preloads are done and it has registered)."""
        try:
            reply = await health_pb2_grpc.HealthStub(self._channel).Check(
                health_pb2.HealthCheckRequest(service=WORKER_SERVICE), timeout=timeout_s
            )
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def _open_stream(self) -> _Stream:
        if self._closed:  # the worker left the registry while this call waited for a slot: its channel is closed
            raise WorkerLost(f"worker {self.worker_id} left the registry")
        if self._stream is None or self._stream.broken:
            self._stream = _Stream(self._stub)
        return self._stream

    async def close_when_quiet(self) -> None:
        """Close once no call is sent or waiting (each ends by its answer, its deadline or the stream breaking)."""
        try:
            await self._quiet.wait()
        finally:
            await self.close()

    async def close(self) -> None:
        self._closed = True
        if self._stream is not None:
            await self._stream.close()
        await self._channel.close()

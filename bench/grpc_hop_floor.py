"""What one Python grpc.aio hop costs on this machine, with nothing else in it.

    python bench/grpc_hop_floor.py [--rounds 3] [--requests 500]

Two bare proxies in front of echo servers that answer at once:

- unary: each Encode is forwarded as a unary Encode call;
- stream: each Encode goes out on one long-lived sie.v1.Worker/Work stream,
  multiplexed by request id, the way the gateway reaches a worker
  (sie_gateway.worker_link: a queue feeding the request stream, a reader
  task settling one future per request).

One client sends one-item requests straight to the echo server and through
each proxy, taking turns request by request; the difference of the p50s is
the least a Python gateway on the project's stack adds, the bar the gateway
hop (`bench/run.py`, under 1 ms) is measured against.

Writes bench/results/<date>-<machine>-grpc-hop-floor.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import multiprocessing
import os
import platform
import statistics
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc

from sie.v1 import inference_pb2, inference_pb2_grpc, worker_pb2, worker_pb2_grpc
from sie_common.edge.auth import bearer_metadata
from sie_stack.processes import free_port

from ours import grpc_sender
from workloads import alternating_latencies_ms

ROOT = Path(__file__).resolve().parents[1]


class Echo(inference_pb2_grpc.InferenceServicer):
    async def Encode(self, request: inference_pb2.EncodeRequest, context: grpc.aio.ServicerContext) -> inference_pb2.EncodeResponse:
        return inference_pb2.EncodeResponse(model=request.model)


class WorkEcho(worker_pb2_grpc.WorkerServicer):
    async def Work(self, requests: AsyncIterator[worker_pb2.WorkRequest], context: grpc.aio.ServicerContext) -> AsyncIterator[worker_pb2.WorkResponse]:
        async for work in requests:
            yield worker_pb2.WorkResponse(request_id=work.request_id, encode=inference_pb2.EncodeResponse(model=work.encode.model))


class UnaryProxy(inference_pb2_grpc.InferenceServicer):
    def __init__(self, target: str) -> None:
        self.target = target
        self.stub: inference_pb2_grpc.InferenceStub | None = None

    async def Encode(self, request: inference_pb2.EncodeRequest, context: grpc.aio.ServicerContext) -> inference_pb2.EncodeResponse:
        if self.stub is None:  # made on the server's event loop
            self.stub = inference_pb2_grpc.InferenceStub(grpc.aio.insecure_channel(self.target))
        return await self.stub.Encode(request)


class StreamProxy(inference_pb2_grpc.InferenceServicer):
    def __init__(self, target: str, token: str = "") -> None:
        self.target = target
        self.metadata = bearer_metadata(token) if token else None
        self.ids = itertools.count()
        self.pending: dict[str, asyncio.Future[worker_pb2.WorkResponse]] = {}
        self.outgoing: asyncio.Queue[worker_pb2.WorkRequest] | None = None

    async def Encode(self, request: inference_pb2.EncodeRequest, context: grpc.aio.ServicerContext) -> inference_pb2.EncodeResponse:
        if self.outgoing is None:  # made on the server's event loop
            self.outgoing = asyncio.Queue()
            call = worker_pb2_grpc.WorkerStub(grpc.aio.insecure_channel(self.target)).Work(self._requests(), metadata=self.metadata)
            self.reader = asyncio.create_task(self._read(call))
        request_id = str(next(self.ids))
        answer = self.pending[request_id] = asyncio.get_running_loop().create_future()
        self.outgoing.put_nowait(worker_pb2.WorkRequest(request_id=request_id, encode=request))
        return (await answer).encode

    async def _requests(self) -> AsyncIterator[worker_pb2.WorkRequest]:
        while True:
            yield await self.outgoing.get()

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        async for response in call:
            self.pending.pop(response.request_id).set_result(response)


def serve(port: int, role: str, target: str = "", token: str = "") -> None:
    async def run() -> None:
        server = grpc.aio.server()
        if role == "work-echo":
            worker_pb2_grpc.add_WorkerServicer_to_server(WorkEcho(), server)
        elif role == "stream":
            inference_pb2_grpc.add_InferenceServicer_to_server(StreamProxy(target, token), server)
        else:
            servicer = {"echo": Echo, "unary": UnaryProxy}[role]
            inference_pb2_grpc.add_InferenceServicer_to_server(servicer(target) if target else servicer(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(run())


@contextlib.contextmanager
def serving(role: str, target: str = "", token: str = "") -> Iterator[str]:
    """One of the servers above ("echo", "work-echo", "unary", "stream"; a proxy forwards to `target`, the stream
    proxy presenting `token` when given) in a process of its own; yields its address once it accepts calls. Spawned, not forked: the caller may already hold gRPC
    channels, which a forked child cannot use."""
    port = free_port()
    process = multiprocessing.get_context("spawn").Process(target=serve, args=(port, role, target, token), daemon=True)
    process.start()
    address = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(address) as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
        yield address
    finally:
        process.terminate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    with contextlib.ExitStack() as running:
        echo = running.enter_context(serving("echo"))
        work_echo = running.enter_context(serving("work-echo"))
        proxies = {"unary": running.enter_context(serving("unary", echo)), "stream": running.enter_context(serving("stream", work_echo))}
        senders = [grpc_sender(address, "echo") for address in (echo, *proxies.values())]
        rounds = []
        for _ in range(args.rounds):
            direct, *proxied = (statistics.median(times) for times in alternating_latencies_ms(senders, args.requests))
            rounds.append({"direct_p50_ms": direct, **{f"{proxy}_added_p50_ms": p50 - direct for proxy, p50 in zip(proxies, proxied)}})
            print("grpc hop floor: direct %.3f ms; added by a unary proxy %.3f ms, by a stream proxy %.3f ms"
                  % (direct, rounds[-1]["unary_added_p50_ms"], rounds[-1]["stream_added_p50_ms"]), flush=True)
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "python": platform.python_version(), "grpcio": grpc.__version__},
        "requests_per_round": args.requests,
        "rounds": rounds,
        **{f"{proxy}_added_p50_ms_median": statistics.median(r[f"{proxy}_added_p50_ms"] for r in rounds) for proxy in ("unary", "stream")},
    }
    out = ROOT / "bench" / "results" / f"{result['date']}-{platform.machine()}-{os.cpu_count()}cores-grpc-hop-floor.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("grpc hop floor: added p50 %.3f ms (unary proxy), %.3f ms (stream proxy), medians of %d rounds; wrote %s"
          % (result["unary_added_p50_ms_median"], result["stream_added_p50_ms_median"], args.rounds, out.relative_to(ROOT)))


if __name__ == "__main__":
    main()

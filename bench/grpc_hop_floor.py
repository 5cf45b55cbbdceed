"""What one Python grpc.aio hop costs on this machine, with nothing else in it.

    python bench/grpc_hop_floor.py [--rounds 3] [--requests 500]

An echo server answers Encode with an empty response; a proxy forwards each
Encode to it with a grpc.aio stub and returns the answer. One client sends
one-item requests to the echo server and through the proxy, taking turns
request by request; the difference of the two p50s is the least any Python
gateway on the project's stack can add, the bar the gateway hop
(`bench/run.py`, under 1 ms) is measured against.

Writes bench/results/<date>-<machine>-grpc-hop-floor.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import multiprocessing
import os
import platform
import statistics
from pathlib import Path

import grpc

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_stack.processes import free_port

from workloads import SINGLE_TEXT, alternating_latencies_ms

ROOT = Path(__file__).resolve().parents[1]


class Echo(inference_pb2_grpc.InferenceServicer):
    async def Encode(self, request: inference_pb2.EncodeRequest, context: grpc.aio.ServicerContext) -> inference_pb2.EncodeResponse:
        return inference_pb2.EncodeResponse(model=request.model)


class Forward(inference_pb2_grpc.InferenceServicer):
    def __init__(self, target: str) -> None:
        self.target = target
        self.stub: inference_pb2_grpc.InferenceStub | None = None

    async def Encode(self, request: inference_pb2.EncodeRequest, context: grpc.aio.ServicerContext) -> inference_pb2.EncodeResponse:
        if self.stub is None:  # made on the server's event loop
            self.stub = inference_pb2_grpc.InferenceStub(grpc.aio.insecure_channel(self.target))
        return await self.stub.Encode(request)


def serve(port: int, forward_to: str | None) -> None:
    async def run() -> None:
        server = grpc.aio.server()
        inference_pb2_grpc.add_InferenceServicer_to_server(Forward(forward_to) if forward_to else Echo(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    echo_port, proxy_port = free_port(), free_port()
    servers = [
        multiprocessing.Process(target=serve, args=(echo_port, None), daemon=True),
        multiprocessing.Process(target=serve, args=(proxy_port, f"127.0.0.1:{echo_port}"), daemon=True),
    ]
    for server in servers:
        server.start()
    request = inference_pb2.EncodeRequest(model="echo", items=[types_pb2.Item(text=SINGLE_TEXT)])

    def sender(port: int):
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=30)
        stub = inference_pb2_grpc.InferenceStub(channel)
        return lambda texts: len(stub.Encode(request, timeout=10).results)

    direct, proxied = sender(echo_port), sender(proxy_port)
    rounds = []
    for _ in range(args.rounds):
        straight, forwarded = alternating_latencies_ms([direct, proxied], args.requests)
        rounds.append({"direct_p50_ms": statistics.median(straight), "proxied_p50_ms": statistics.median(forwarded)})
        rounds[-1]["added_p50_ms"] = rounds[-1]["proxied_p50_ms"] - rounds[-1]["direct_p50_ms"]
        print(f"grpc hop floor: direct {rounds[-1]['direct_p50_ms']:.3f} ms, through a proxy {rounds[-1]['proxied_p50_ms']:.3f} ms, "
              f"added {rounds[-1]['added_p50_ms']:.3f} ms", flush=True)
    for server in servers:
        server.terminate()
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "python": platform.python_version(), "grpcio": grpc.__version__},
        "requests_per_round": args.requests,
        "rounds": rounds,
        "added_p50_ms_median": statistics.median(r["added_p50_ms"] for r in rounds),
    }
    out = ROOT / "bench" / "results" / f"{result['date']}-{platform.machine()}-{os.cpu_count()}cores-grpc-hop-floor.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"grpc hop floor: added p50 {result['added_p50_ms_median']:.3f} ms (median of {args.rounds} rounds); wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

"""Service launchers for tests and benchmarks (they live in sie_stack, which `sie up` uses too)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc

from sie.v1 import inference_pb2_grpc
from sie_stack.processes import ServiceProcess as WorkerProcess
from sie_stack.processes import free_port

__all__ = ["WorkerProcess", "free_port", "inference_stub", "serving_worker", "stop_all"]


@contextmanager
def serving_worker(env: Mapping[str, str], log: Path) -> Iterator[WorkerProcess]:
    """A worker started with `env` (its log at `log`), once it reports SERVING; stopped on the way out."""
    worker = WorkerProcess(env, log)
    try:
        worker.wait_serving()
        yield worker
    finally:
        worker.stop()


@contextmanager
def inference_stub(worker: WorkerProcess) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with grpc.insecure_channel(worker.address) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


def stop_all(processes: Iterable[WorkerProcess]) -> None:
    """Stop the processes together: each one's shutdown (its drain) overlaps the others' instead of following them."""
    processes = list(processes)
    if processes:
        with ThreadPoolExecutor(max_workers=len(processes)) as pool:
            list(pool.map(lambda process: process.stop(), processes))

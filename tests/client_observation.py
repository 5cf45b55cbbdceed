"""What a client did, seen from outside it: the TCP connections it opened (a relay in front of a real server counts
them), the requests a real worker answered (its Prometheus counter) and the work an event loop handed to threads.
The integration tests check frameworks' conventions with these, patching nothing in the client or the framework;
and compare what an integration gives with the engine's own answers (`engine_answers`)."""

from __future__ import annotations

import contextlib
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from reliability.link_cutter import LinkCutter
from sie_client import SIEClient
from worker_process import WorkerProcess

# The test models the integration tests use (tests/conftest.py), by role.
EMBEDDER = "test/tiny-mean"
RERANKER = "test/tiny-reranker"
EXTRACTOR = "test/tiny-ner"


@dataclass(frozen=True)
class EngineAnswers:
    """The engine's own answers for some texts and a query, through SIEClient: what an integration must give."""

    documents: np.ndarray  # (texts, dims): the texts encoded as documents
    query: np.ndarray  # the query encoded with is_query=True
    ranking: list[tuple[int, float]]  # the reranker's (index, score), best first
    entities: list[list[dict[str, Any]]]  # the extractor's entities of each text


def engine_answers(address: str, texts: list[str], query: str) -> EngineAnswers:
    with SIEClient(address) as client:
        return EngineAnswers(
            documents=np.stack([r["dense"] for r in client.encode(EMBEDDER, texts)]),
            query=client.encode(EMBEDDER, query, is_query=True)["dense"],
            ranking=[(s["index"], s["score"]) for s in client.score(RERANKER, query, texts)["scores"]],
            entities=[[dict(e) for e in r["entities"]] for r in client.extract(EXTRACTOR, texts)],
        )


@contextlib.contextmanager
def connection_counter(upstream: str) -> Iterator[LinkCutter]:
    """A TCP relay on loopback in front of `upstream` (host:port): a client pointed at its `address` reaches the
    server through it, and its `accepted` counts the connections the client opened."""
    relay = LinkCutter(upstream)
    try:
        yield relay
    finally:
        relay.close()


class ThreadHandoffs(ThreadPoolExecutor):
    """An event loop's default executor that counts the work handed to it: what `asyncio.to_thread` and
    `run_in_executor(None, ...)` send, i.e. an async method that falls back to a thread."""

    def __init__(self) -> None:
        super().__init__(max_workers=4)
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def requests_answered(worker: WorkerProcess, model: str, operation: str) -> float:
    """The worker's sie_worker_requests_total for `model` and `operation` with status OK: one per request it answered
    (a unary call or one request of an EncodeStream)."""
    with urllib.request.urlopen(f"{worker.metrics_url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sie_worker_requests_total" and sample.labels == {
                "model": model,
                "operation": operation,
                "status": "OK",
            }:
                return sample.value
    return 0.0


def answered_since(worker: WorkerProcess, model: str, operation: str, before: float, expected: int) -> float:
    """How many requests the worker answered since it had answered `before`: waited for until there are `expected`
    (the worker counts a request just after its answer leaves, so a caller can read the counter first), for at most
    10 s; more than `expected` shows as more."""
    deadline = time.monotonic() + 10
    while requests_answered(worker, model, operation) - before < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return requests_answered(worker, model, operation) - before

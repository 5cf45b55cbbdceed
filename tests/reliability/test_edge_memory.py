"""Envoy's memory stays bounded under slow senders: 30 unauthenticated connections each sending most of a 16 MB body
and then holding it took Envoy from 198 to 543 MB (the Kubernetes base gave it 512 MiB). Now the request check keeps
each JSON body's chunks as they arrive, leased from a per-thread budget (a third of the overload manager's heap limit
over the threads, in the check's Lua memory, outside that heap), and cuts a body off when its next chunk does not fit
(503 OVERLOADED); a held body is dropped at the request timeout, which more bytes do not renew. Measured here from 30
client addresses, so no per-peer share stops them first. Envoy's heap grows only by what its threads hold in passing
(HEAP_GROWTH)."""

from __future__ import annotations

import json
import os
import time

import pytest
from edge_load import MB, answered, peers, request, running_edge, slow_senders

from sie_stack.envoy_config import CONNECTION_BUFFER_BYTES, WORKER_THREADS

# Starts processes (its Envoy) in fixtures of its own.
pytestmark = pytest.mark.process

# What the rendered defaults let JSON bodies hold: a third of the overload manager's 384 MiB heap limit
# (sie_stack.envoy_config.DEFAULT_MAX_HEAP_BYTES, BODY_BUDGET_SHARE), bodies of 64 KiB or more three quarters of it;
# and the Kubernetes base's limit for Envoy (deploy/kustomize/base/envoy/envoy.yaml), which also holds that heap.
# Literals, so a change of them is a change here too.
BODIES_HELD = 128 * MB
LARGE_BODIES_HELD = BODIES_HELD * 3 // 4
MAX_HEAP = 384 * MB
KUBERNETES_LIMIT = 640 * MB
# What Lua holds beyond the bodies: the whole-body copy the check reads (one per thread at a time) and chunks not yet
# collected (a full collection every eighth of a thread's budget).
LUA_SLACK = 64 * MB
# What slow senders cost the heap the overload manager watches (its fixed heap monitor counts what tcmalloc keeps mapped,
# free or not): each worker thread holds one read from a connection at a time, at most the listener's per-connection
# buffer (1 MiB), and the copy of it the check takes; and tcmalloc keeps freed memory in its per-CPU caches, 3 MiB a
# CPU at most, on the CPUs Envoy's threads (2 workers, the main thread) run on. Before the per-connection buffer was
# 1 MiB it was the 16 MiB body limit, and 30 slow senders took the heap from 12 to 46 MB in a busy clean-clone run;
# now 11 -> 14 MB at a load of 11 on 2 cores.
HEAP_GROWTH = WORKER_THREADS * 2 * CONNECTION_BUFFER_BYTES + 3 * MB * min(os.cpu_count() or 1, WORKER_THREADS + 1)


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    with running_edge(tmp_path_factory.mktemp("memory")) as running:
        yield running


def test_slow_senders_cannot_grow_envoy_past_its_limit(edge, reliability_report) -> None:
    idle_rss, idle_heap = edge.rss_bytes(), edge.heap_bytes()
    peak_rss = peak_heap = 0
    with slow_senders(edge.port, 30, 16 * MB, 15 * MB, sources=peers(30)) as sockets:
        for _ in range(12):
            peak_rss, peak_heap = max(peak_rss, edge.rss_bytes()), max(peak_heap, edge.heap_bytes())
            time.sleep(0.25)
        lines = answered(sockets)
        # ...and while they hold what they may, a small request still gets its answer (here: the check's refusal):
        # big bodies hold at most three quarters of the budget.
        status, seconds, _ = request(edge.port, "POST", "/v1/encode/m", b'{"colour": 1}')
    refused = [line for line in lines if line.startswith("HTTP/1.1 503")]
    reliability_report.add(
        "edge", "30 slow senders of 16 MB bodies, from 30 addresses", idle_rss_mb=idle_rss // MB,
        peak_rss_mb=peak_rss // MB, peak_heap_mb=peak_heap // MB, refused_at_once=len(refused),
    )  # fmt: skip
    assert peak_rss - idle_rss < LARGE_BODIES_HELD + LUA_SLACK, f"RSS {idle_rss // MB} -> {peak_rss // MB} MB"
    # the bodies are not in the heap the overload manager watches: its limit stays for the rest
    assert peak_heap < idle_heap + HEAP_GROWTH, f"heap {idle_heap // MB} -> {peak_heap // MB} MB"
    assert MAX_HEAP + peak_rss - idle_heap < KUBERNETES_LIMIT, "the heap limit and these bodies overrun the limit"
    # 15 MB each, bodies of 64 KiB or more at most LARGE_BODIES_HELD: the rest are cut off as they pass it
    assert len(refused) >= 30 - LARGE_BODIES_HELD // (15 * MB), lines
    assert (status, seconds < 2) == (400, True)


def test_a_slow_sender_cut_off_gets_the_json_overloaded_answer_at_once(edge) -> None:
    """Cut off mid-body, it is answered before it sends the rest (the check ends its request at the chunk that did not
    fit): JSON, reason OVERLOADED, retry-after."""
    with slow_senders(edge.port, 20, 16 * MB, 15 * MB, sources=peers(20)) as sockets:
        for sender in sockets:
            sender.settimeout(0.5)
        replies = []
        for sender in sockets:
            try:
                replies.append(sender.recv(65536).decode())
            except OSError:
                continue
    overloaded = [reply for reply in replies if reply.startswith("HTTP/1.1 503")]
    assert len(overloaded) >= 20 - LARGE_BODIES_HELD // (15 * MB), replies
    head, _, body = overloaded[0].partition("\r\n\r\n")
    assert "retry-after: 1" in head.lower()
    assert json.loads(body)["details"][0]["reason"] == "OVERLOADED"

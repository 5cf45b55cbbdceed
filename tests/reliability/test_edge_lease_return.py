"""The share of Envoy's body budget that a reset request held comes back at once, not up to a second later. The
request check learns that a request ended without a word (its client reset it mid-body) only from a full collection of
its Lua state, which it ran when a lease did not fit at most once a clock second: a client whose bodies had filled its
share, reset them and sent one honest body at once got 503 OVERLOADED for the rest of that second (issue 32, gap (b);
tests had to wait for the budget to come back). Envoy's Lua has no hook at a stream's end, so the check now collects
when a lease does not fit at most every 20 ms of Envoy's millisecond clock (request_check.lua, PURGE_GAP_MS).

Envoy alone, in front of a gateway nobody serves: a body the check passes gets 503 UPSTREAM_UNAVAILABLE."""

from __future__ import annotations

import json
import time

import pytest
from edge_load import MB, answered, request, running_edge, slow_senders

# Starts processes (its Envoy).
pytestmark = pytest.mark.process

PASSED = "UPSTREAM_UNAVAILABLE"
# A small edge: 8 MiB of bodies per thread, 4 MiB of one address (a third of the heap limit over 2 threads, half).
SMALL = {"max_request_bytes": 4 * MB, "max_heap_bytes": 48 * MB}
SOURCE = "127.0.0.9"


def honest_reason(port: int) -> str:
    body = ('{"items":[{"text":"' + "a" * (3 * MB) + '"}]}').encode()
    return json.loads(request(port, "POST", "/v1/encode/m", body, source=SOURCE)[2])["details"][0]["reason"]


def test_a_reset_requests_share_comes_back_for_the_next_body_at_once(tmp_path) -> None:
    with running_edge(tmp_path, **SMALL) as edge:
        for _ in range(3):
            # Two 3 MiB bodies an Envoy thread from one address: one fits its 4 MiB share there, the other is
            # refused (and the check collects for it).
            with slow_senders(edge.port, 4, 4 * MB, 3 * MB, sources=[SOURCE]) as sockets:
                time.sleep(0.3)
                lines = answered(sockets)
                assert sum("503" in line for line in lines) >= 1, lines
            time.sleep(0.1)  # closed: Envoy resets the requests still waiting for their bodies
            assert honest_reason(edge.port) == PASSED

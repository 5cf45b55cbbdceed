"""Envoy's budget for JSON bodies cannot be taken by bodies that are only announced. The request check leases each
body's `content-length` from its Envoy thread's budget when the headers arrive, and holds the lease until the body
is in, or the request times out (60 s, renewable by reconnecting): so connections that announce big bodies and send
no byte of them hold the budget at no cost (issue 32, attack round 3, no token needed). Measured on Envoy alone:
30 connections announcing 9 MiB each made every honest body of 64 KiB or more 503 OVERLOADED; 40 x 8 MiB, 100 x 1 MiB
and 800 x (64 KiB - 1) announcements made even 1 KB bodies 503 OVERLOADED; over HTTP/2, 52 connections of 100
streams each did most of that.

The fix needs the budget to count bytes Envoy holds, not bytes announced (e.g. the check reading the body chunk by
chunk and leasing each chunk as it arrives, refusing past the budget then), or a bound on what one connection, and
one peer, may lease; until then this test is xfail."""

from __future__ import annotations

import json
import time

import pytest
from edge_load import MB, held_connections, request, running_edge

ANNOUNCERS = 30
ANNOUNCED = 9 * MB  # 8 of them fill a thread's share for bodies of 64 KiB or more (72 MiB of 96)


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    with running_edge(tmp_path_factory.mktemp("body-budget")) as running:
        yield running


def announcement(size: int) -> bytes:
    """A JSON encode request's headers announcing `size` bytes of body."""
    return (
        f"POST /v1/encode/m HTTP/1.1\r\nhost: edge\r\ncontent-type: application/json\r\ncontent-length: {size}\r\n\r\n"
    ).encode()


def reason(port: int, body_bytes: int) -> str:
    """The answer's reason for an honest body: a 100 KB text passes the check and meets the absent gateway."""
    body = ('{"items":[{"text":"' + "a" * (body_bytes - 24) + '"}]}').encode()
    _, _, got = request(port, "POST", "/v1/encode/m", body)
    return json.loads(got)["details"][0]["reason"]


@pytest.mark.xfail(
    strict=True,
    reason="the request check leases announced content-length, not bytes received: connections that announce big "
    "bodies and send nothing hold Envoy's body budget (fix: lease bytes as they arrive, or bound leases per "
    "connection and per peer)",
)
def test_bodies_announced_and_never_sent_do_not_keep_honest_bodies_out(edge, reliability_report) -> None:
    assert reason(edge.port, 100_000) == "UPSTREAM_UNAVAILABLE"  # checked and passed on, with no announcers
    with held_connections(edge.port, ANNOUNCERS, announcement(ANNOUNCED)):
        time.sleep(1)
        reasons = [reason(edge.port, 100_000) for _ in range(10)]
    reliability_report.add(
        "edge", f"{ANNOUNCERS} connections announcing {ANNOUNCED // MB} MiB bodies, sending none",
        honest_100kb=f"{reasons.count('OVERLOADED')} of 10 refused OVERLOADED",
    )  # fmt: skip
    assert reasons.count("OVERLOADED") == 0, reasons

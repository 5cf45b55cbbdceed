"""One client address holds at most its share of Envoy's JSON body budget, whatever `x-forwarded-for` it sends. The
request check took a body's peer from Envoy's downstream remote address, which Envoy (not told to use the connection's
own address) reads from the last `x-forwarded-for` entry: 20 connections from one address, each naming another in the
header and sending 8 of 16 MiB, held 80 MiB and another client's 8 MiB body got 503 OVERLOADED (issue 32, attack
round 4). The check now keys a body by the connection's own peer.

Two addresses that announce bodies and send none no longer take every place for a body. The check lets at most 1024
bodies arrive at once per Envoy worker thread, 512 of one client address (each waiting request costs Envoy some 30 KB):
2 x 16 HTTP/2 connections of 100 streams sending headers only (no token needed) made every other caller's 1 KB body 503
OVERLOADED until Envoy's 60 s request timeout, renewable at will (issue 32, gap (a)). Past the 1024, 256 more places are
kept for addresses that hold fewer than 8, 8 each at most: an attacker now needs 32 more addresses to fill those (a
waiting request holds its place until its body arrives or it times out; the check has no timer to end one that sends
nothing).

Envoy alone, in front of a gateway nobody serves: a body the check passes gets 503 UPSTREAM_UNAVAILABLE."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time

import pytest
from edge_load import MB, answered, request, running_edge

from raw_http2 import connections

# Starts processes (its Envoy) in fixtures of its own.
pytestmark = pytest.mark.process

PASSED = "UPSTREAM_UNAVAILABLE"
THREADS, PEER_BUDGET = 2, 32 * MB  # the rendered defaults' per-thread figures (test_edge_body_budget.py)
CONNECTIONS = 16  # HTTP/2 connections of 100 streams an address
RESERVE_PER_ADDRESS = 8  # the places past a thread's 1024 that an address holding fewer may take (request_check.lua)


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    with running_edge(tmp_path_factory.mktemp("forwarded-peers")) as running:
        yield running


def test_forwarded_for_does_not_make_one_client_many_peers(edge) -> None:
    sockets = []
    try:
        for n in range(20):
            sender = socket.create_connection(("127.0.0.1", edge.port), timeout=1)
            sender.sendall(
                f"POST /v1/encode/m HTTP/1.1\r\nhost: edge\r\ncontent-type: application/json\r\n"
                f'content-length: {16 * MB}\r\nx-forwarded-for: 10.0.{n}.1\r\n\r\n{{"items":[{{"text":"'.encode()
            )
            sockets.append(sender)
        for _ in range(8):  # 8 MiB each, bytes that differ between senders (Lua keeps one copy of equal strings)
            for sender in sockets:
                with contextlib.suppress(OSError):
                    sender.sendall(os.urandom(MB // 2).hex().encode())
        time.sleep(0.5)
        lines = answered(sockets)
        other = request(edge.port, "POST", "/v1/encode/m", b'{"items":[{"text":"' + b"a" * (8 * MB) + b'"}]}',
                        source="127.0.0.2")  # fmt: skip
    finally:
        for sender in sockets:
            sender.close()
    assert json.loads(other[2])["details"][0]["reason"] == PASSED
    assert lines.count("") <= THREADS * PEER_BUDGET // (8 * MB), lines


def test_two_addresses_announcing_bodies_do_not_keep_a_third_out(tmp_path) -> None:
    # An Envoy of its own: connections the other test closed, not yet counted out by Envoy, would skew how
    # exact_balance spreads these over the threads, and a thread one address under-fills keeps places free.
    # 16 connections an address put 800 streams of each on each thread, over its 512 places whatever the spread.
    headers = [("content-type", "application/json"), ("content-length", str(MB))]
    with (
        running_edge(tmp_path) as edge,
        connections(edge.port, CONNECTIONS, source="127.0.0.4") as first,
        connections(edge.port, CONNECTIONS, source="127.0.0.5") as second,
    ):
        for connection in first + second:
            for _ in range(100):
                connection.request("POST", "/v1/encode/m", headers, end=False)
        # every stream seen: each address's streams less the 2 x 512 places it may take are refused at once
        deadline = time.monotonic() + 20
        while sum(len(connection.bodies) for connection in first + second) < 2 * (CONNECTIONS * 100 - 1024):
            assert time.monotonic() < deadline, "Envoy did not answer the streams past the places"
            for connection in first + second:
                connection.read(lambda: False, 0.05)
        answers = [
            request(edge.port, "POST", "/v1/encode/m", b'{"items":[{"text":"x"}]}', source="127.0.0.2")[2]
            for _ in range(5)
        ]
        # A third address announcing bodies itself takes at most 8 of the kept places on its thread, the rest refused.
        with connections(edge.port, 1, source="127.0.0.6") as (third,):
            for _ in range(20):
                third.request("POST", "/v1/encode/m", headers, end=False)
            third.read(lambda: len(third.bodies) >= 20 - RESERVE_PER_ADDRESS, 10)
            third.read(lambda: False, 0.5)
            refused = len(third.bodies)
    reasons = [json.loads(answer)["details"][0]["reason"] for answer in answers]
    assert reasons == [PASSED] * 5, reasons
    assert refused == 20 - RESERVE_PER_ADDRESS, refused

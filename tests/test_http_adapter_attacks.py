"""Defects the adversarial pass over the HTTP adapter (issues 34 and 35) found, each reproduced here; all are fixed
(they were marked xfail(strict=True) until their fixes landed).

In process (http_adapter_in_process.py): the adapter as the gateway starts it, calling a real grpc.aio server on its
Unix socket; where a test is about tokens that server runs the gateway's own Authorize interceptor and the adapter
the gateway's settings. The same inputs were first tried on a live `sie up` through Envoy."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
import tracemalloc
from collections.abc import Awaitable, Callable

import aiohttp
import numpy as np
import pytest

from http_adapter_in_process import JSON, REFERENCE, RERANK, Gateway, MiB, running_adapter
from sie.v1 import inference_pb2
from sie_common.edge.auth import Authorize, inference_checks
from sie_contract.tensors import to_tensor
from sie_gateway.http_adapter.bodies import BodyLimits, json_body
from sie_gateway.http_adapter.errors import AdapterError

HUGE_INT = "1" + "0" * 400  # a JSON integer Python reads (under its 4,300 digits) and no float holds


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/extract/m/ner", '{"items": [{"text": "x"}], "params": {"threshold": %s}}'),
        ("/v1/encode/m/encoder", '{"items": [{"text": "x"}], "params": {"options": {"k": %s}}}'),
        ("/v1/encode/m/encoder", '{"items": [{"text": "x", "metadata": {"k": %s}}]}'),
        ("/v1/score/m/reranker", '{"query": "q", "items": ["a"], "options": {"k": %s}}'),
    ],
    ids=["threshold", "options", "metadata", "score-options"],
)
async def test_a_json_integer_past_a_floats_range_is_400_not_internal(path: str, body: str) -> None:
    async with (
        running_adapter(Gateway()) as url,
        aiohttp.ClientSession() as session,
        session.post(url + path, data=body % HUGE_INT, headers=REFERENCE) as response,
    ):
        answer = await response.json()
        assert (response.status, answer["error"]["code"]) != (500, "INTERNAL")
        assert response.status == 400, answer


def _stalled(port: int, count: int, chunked: bool) -> list[socket.socket]:
    """`count` connections that each send a rerank's headers and 5 bytes of its body, then nothing."""
    framing = b"Transfer-Encoding: chunked\r\n\r\n5\r\n" if chunked else b"Content-Length: 16777216\r\n\r\n"
    stalled = []
    for _ in range(count):
        connection = socket.create_connection(("127.0.0.1", port))
        connection.sendall(b"POST /v1/rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + framing)
        connection.sendall(b'{"mod')
        stalled.append(connection)
    return stalled


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_stalled_bodies_do_not_lock_other_callers_out(chunked: bool) -> None:
    async with running_adapter(Gateway()) as url:
        stalled = _stalled(int(url.rsplit(":", 1)[1]), 16, chunked)
        try:
            await asyncio.sleep(0.5)  # the adapter has read their headers
            async with (
                aiohttp.ClientSession() as session,
                session.post(url + "/v1/rerank", json=RERANK) as response,
            ):
                answer = await response.json()
                assert response.status == 200, answer
        finally:
            for connection in stalled:
                connection.close()


async def test_a_compressed_body_does_not_bypass_the_body_budget() -> None:
    gateway = Gateway()
    gateway.hold = True
    env = {"SIE_GATEWAY_HTTP_MAX_BODY_BYTES": str(4 * MiB), "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES": str(8 * MiB)}
    body = json.dumps({"model": "m/reranker", "query": "q", "documents": ["a" * (3 * MiB)]}).encode()
    compressed = gzip.compress(body)
    headers = {**JSON, "content-encoding": "gzip"}
    async with running_adapter(gateway, env) as url, aiohttp.ClientSession() as session:

        async def post() -> int:
            async with session.post(url + "/v1/rerank", data=compressed, headers=headers) as response:
                return response.status

        posts = [asyncio.create_task(post()) for _ in range(4)]
        deadline = time.monotonic() + 10
        while len(gateway.scores) < 4 and time.monotonic() < deadline and not all(p.done() for p in posts):
            await asyncio.sleep(0.05)
        held_at_once = sum(len(request.items[0].text) for request in gateway.scores)
        gateway.release.set()
        await asyncio.gather(*posts)
    assert held_at_once <= 8 * MiB, f"{held_at_once / MiB:.0f} MiB of inflated bodies in flight at once"


# The adapter's default body bounds (HttpAdapterSettings).
LIMITS = BodyLimits(max_bytes=16 * MiB, max_depth=32, max_container_len=16384, max_values=262144, read_timeout_s=30)


@pytest.mark.parametrize(
    "body",
    [
        b'{"documents": [' + b"[]," * (5 * MiB) + b"[]]}",
        b'{"documents": [' + b"0.5," * (4 * MiB - 8) + b"0]}",
    ],
    ids=["many-empty-arrays", "one-long-array"],
)
def test_a_json_body_of_many_values_is_refused_before_it_is_built(body: bytes) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(AdapterError) as raised:
            json_body(body, LIMITS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert raised.value.reason in ("TOO_MANY_VALUES", "CONTAINER_TOO_LONG")
    assert peak < 64 * MiB, f"{peak / MiB:.0f} MiB built for a {len(body) / MiB:.0f} MiB body"


async def _longest_stall(during: Callable[[], Awaitable[None]]) -> float:
    """The longest the event loop went without running a 10 ms ticker while `during()` ran, in seconds."""
    longest, last, done = 0.0, time.monotonic(), False

    async def tick() -> None:
        nonlocal longest, last
        while not done:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            longest, last = max(longest, now - last), now

    ticker = asyncio.create_task(tick())
    try:
        await during()
    finally:
        done = True
        await ticker
    return longest


async def test_a_large_json_answer_does_not_stall_the_event_loop() -> None:
    gateway = Gateway()
    count = 2000
    vectors = np.random.default_rng(0).standard_normal((128, 16)).astype(np.float32)
    gateway.encode_answer = inference_pb2.EncodeResponse(
        model="m/colbert",
        results=[inference_pb2.EncodeResult(multivector=to_tensor(vectors, "float32")) for _ in range(count)],
    )
    async with running_adapter(gateway) as url, aiohttp.ClientSession() as session:
        raw = bytearray()

        async def embed_all() -> None:
            body = {"inputs": ["some text"] * count}
            async with session.post(url + "/tei/m/colbert/embed_all", json=body) as response:
                assert response.status == 200, await response.text()
                raw.extend(await response.read())

        stall = await _longest_stall(embed_all)
    # Parsed after the timed call: this test's client shares the adapter's event loop, and json.loads of 43 MiB
    # would stall it for seconds itself.
    answer = json.loads(raw)
    assert len(answer) == count and len(answer[0]) == 128
    assert stall < 1.0, f"the event loop stalled {stall:.1f} s"


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/tei/m/encoder/tokenize", JSON),
        ("/tei/m/encoder/decode", JSON),
        ("/tei/m/encoder/predict", JSON),
        ("/v1/generate", REFERENCE),
        ("/v1/chat/completions", REFERENCE),
    ],
)
async def test_every_adapter_route_needs_a_token(path: str, headers: dict[str, str]) -> None:
    checks = Authorize(inference_checks("static", ("the-token",)))
    auth = {"SIE_AUTH_MODE": "static", "SIE_AUTH_TOKENS": "the-token"}  # the gateway's settings, as its interceptor's
    async with (
        running_adapter(Gateway(), auth, interceptors=(checks,)) as url,
        aiohttp.ClientSession() as session,
        session.post(url + path, data=b'{"inputs": "x"}', headers=headers) as response,
    ):
        assert response.status == 401, await response.text()

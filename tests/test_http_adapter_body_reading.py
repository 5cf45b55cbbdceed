"""How the HTTP adapter reads a request before any work: the token first (a caller without one reads and holds
nothing), a compressed body refused (415, never inflated), a body's share of the body budget only what has
arrived, a body not in within SIE_GATEWAY_HTTP_BODY_TIMEOUT_S refused (408); TEI's answer to a full budget (429
Overloaded) and `model@profile` on OpenAI's model route. In process, over a stand-in gateway on the Unix socket
(http_adapter_in_process.py)."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket

import aiohttp
import pytest

from http_adapter_in_process import JSON, REFERENCE, RERANK, Gateway, MiB, running_adapter

STATIC = {"SIE_AUTH_MODE": "static", "SIE_AUTH_TOKENS": "the-token"}
TOKEN = {"authorization": "Bearer the-token"}


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.mark.parametrize(
    ("path", "headers", "reason_of"),
    [
        ("/v1/rerank", JSON, lambda body: body["reason"]),
        ("/tei/m/encoder/embed", JSON, lambda body: body["error_type"]),
        ("/v1/encode/m/encoder", REFERENCE, lambda body: body["error"]["code"]),
    ],
    ids=["rerank", "tei", "reference"],
)
async def test_a_compressed_body_is_415_before_it_is_read(path: str, headers: dict[str, str], reason_of) -> None:
    gateway = Gateway()
    body = gzip.compress(json.dumps({"inputs": "x", "items": [{"text": "x"}], **RERANK}).encode())
    async with (
        running_adapter(gateway) as url,
        aiohttp.ClientSession() as session,
        session.post(url + path, data=body, headers={**headers, "content-encoding": "gzip"}) as response,
    ):
        answer = await response.json()
    assert response.status == 415, answer
    assert reason_of(answer) in ("UNSUPPORTED_MEDIA_TYPE", "Validation")
    assert gateway.scores == [] and gateway.described == []


async def test_a_body_not_in_within_the_read_timeout_is_408_and_frees_its_share() -> None:
    env = {"SIE_GATEWAY_HTTP_BODY_TIMEOUT_S": "1", "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES": str(MiB)}
    async with running_adapter(Gateway(), env) as url:
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(url))
        head = (
            b"POST /v1/rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 900000\r\n\r\n"
        )
        writer.write(head + b"{" + b" " * 800000)  # most of the budget, then nothing more
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        rest = await asyncio.wait_for(reader.read(4096), 10)
        writer.close()
        assert status_line.startswith(b"HTTP/1.1 408"), status_line
        assert b'"REQUEST_TIMEOUT"' in rest
        async with aiohttp.ClientSession() as session, session.post(url + "/v1/rerank", json=RERANK) as response:
            assert response.status == 200, await response.text()  # the stalled body's share came back


def test_a_caller_without_a_token_is_401_before_its_body_is_read() -> None:
    async def run() -> None:
        async with running_adapter(Gateway(), {**STATIC, "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES": str(MiB)}) as url:
            stalled = []
            for _ in range(8):  # each announces the whole budget and sends 5 bytes
                connection = socket.create_connection(("127.0.0.1", _port(url)))
                connection.sendall(
                    b"POST /v1/rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b'Content-Length: 1048576\r\n\r\n{"mod'
                )
                stalled.append(connection)
            try:
                for connection in stalled:
                    connection.settimeout(10)
                    assert (await asyncio.to_thread(connection.recv, 12)) == b"HTTP/1.1 401"
                async with (
                    aiohttp.ClientSession() as session,
                    session.post(url + "/v1/rerank", json=RERANK, headers=TOKEN) as response,
                ):
                    assert response.status == 200, await response.text()
            finally:
                for connection in stalled:
                    connection.close()

    asyncio.run(run())


async def test_tei_answers_a_full_body_budget_429_overloaded() -> None:
    gateway = Gateway()
    gateway.hold = True
    env = {"SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES": str(64 * 1024)}
    async with running_adapter(gateway, env) as url, aiohttp.ClientSession() as session:
        rerank = {"query": "q", "texts": ["a" * 60000]}
        held = asyncio.create_task(session.post(url + "/tei/m/reranker/rerank", json=rerank))
        while not gateway.scores:
            await asyncio.sleep(0.01)
        async with session.post(url + "/tei/m/reranker/rerank", json={"query": "q", "texts": ["b" * 8000]}) as refused:
            answer = await refused.json()
        gateway.release.set()
        (await held).release()
    assert refused.status == 429, answer
    assert answer["error_type"] == "Overloaded" and refused.headers["retry-after"] == "1"


async def test_openai_model_route_reads_model_at_profile_as_the_model() -> None:
    gateway = Gateway()
    async with (
        running_adapter(gateway) as url,
        aiohttp.ClientSession() as session,
        session.get(url + "/v1/models/m/encoder@fast") as response,
    ):
        answer = await response.json()
    assert response.status == 200, answer
    assert gateway.described == ["m/encoder"] and answer["id"] == "m/encoder"

"""What one caller may hold of the HTTP adapter's body budget. Before, one caller with a valid token held the whole
256 MiB (20 bodies of 16 MiB, each sent but its last byte) for the 30 s body timeout, repeatably, and every other
caller got 503 (issue 32). Now a token holds at most SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES however many
connections share it, and a body still arriving SIE_GATEWAY_HTTP_BODY_EVICT_AFTER_S after it began is dropped (408)
when the budget is full and a body sent at once needs room; a body that has all arrived is never dropped. In
process, over a stand-in gateway on the Unix socket (http_adapter_in_process.py), the bounds scaled down."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from http_adapter_in_process import JSON, RERANK, Gateway, MiB, running_adapter
from sie_common.runtime.settings import SettingsError, load_settings
from sie_gateway.settings import GatewaySettings

TOKENS = {"SIE_AUTH_MODE": "static", "SIE_AUTH_TOKENS": "token-a,token-b"}
BOUNDS = {
    "SIE_GATEWAY_HTTP_MAX_BODY_BYTES": str(MiB),
    "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES": str(4 * MiB),
    "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES": str(2 * MiB),
}
NEVER_EVICT = {"SIE_GATEWAY_HTTP_BODY_EVICT_AFTER_S": "600"}


class Stalled:
    """A connection that announces a body of `size` bytes and sends all of it but the last byte."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str, size: int = MiB, token: str | None = None) -> Stalled:
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        authorization = f"Authorization: Bearer {token}\r\n" if token else ""
        head = (
            f"POST /v1/rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{authorization}"
            f"Content-Length: {size}\r\n\r\n"
        ).encode()
        writer.write(head + b"{" + b" " * (size - 2))
        with contextlib.suppress(TimeoutError, ConnectionError):  # a refused body is not read to its end
            await asyncio.wait_for(writer.drain(), 5)
        return cls(reader, writer)

    async def answer(self, within_s: float) -> tuple[int, dict]:
        """(status, JSON body) of the answer; TimeoutError if none comes within `within_s`."""
        status_line = await asyncio.wait_for(self.reader.readline(), within_s)
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-l"))
        body = await asyncio.wait_for(self.reader.readexactly(length), 5)
        return int(status_line.split()[1]), json.loads(body)

    async def unanswered_for(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self.reader.read(1), seconds)
        except TimeoutError:
            return True
        return False

    def close(self) -> None:
        self.writer.close()


@contextlib.asynccontextmanager
async def stalled_bodies() -> AsyncIterator[list[Stalled]]:
    opened: list[Stalled] = []
    try:
        yield opened
    finally:
        for connection in opened:
            connection.close()


async def rerank(url: str, token: str | None = None, documents: list[str] | None = None) -> tuple[int, dict]:
    headers = {**JSON, **({"authorization": f"Bearer {token}"} if token else {})}
    body = {**RERANK, **({"documents": documents} if documents else {})}
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/rerank", json=body, headers=headers) as r:
        return r.status, await r.json()


async def test_one_token_holds_its_share_and_another_token_is_still_served() -> None:
    async with running_adapter(Gateway(), {**TOKENS, **BOUNDS, **NEVER_EVICT}) as url, stalled_bodies() as opened:
        for _ in range(4):  # on their own, four would fill the whole budget
            opened.append(await Stalled.open(url, token="token-a"))
            await asyncio.sleep(0.3)
        held, refused = opened[:2], opened[2:]
        for connection in held:
            assert await connection.unanswered_for(0.5)
        for connection in refused:
            status, answer = await connection.answer(10)
            assert status == 503 and answer["reason"] == "OVERLOADED", answer
            assert "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES" in answer["message"], answer
        status, answer = await rerank(url, token="token-b")
        assert status == 200, answer
        # The same token on a new connection is the same caller, still at its share.
        status, answer = await rerank(url, token="token-a", documents=["d" * (MiB // 2)])
        assert status == 503 and answer["reason"] == "OVERLOADED", answer


async def test_bodies_stalled_past_the_eviction_age_are_dropped_for_a_body_sent_at_once() -> None:
    # One client address holding the whole budget: as every caller is behind a proxy that hides their addresses.
    env = {
        **BOUNDS,
        "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES": str(4 * MiB),
        "SIE_GATEWAY_HTTP_BODY_EVICT_AFTER_S": "1",
    }
    async with running_adapter(Gateway(), env) as url, stalled_bodies() as opened:
        for _ in range(4):
            opened.append(await Stalled.open(url))
            await asyncio.sleep(0.1)
        status, answer = await rerank(url, documents=["d" * (MiB // 2)])
        assert status == 503 and answer["reason"] == "OVERLOADED", answer  # none stalled for a second yet
        await asyncio.sleep(1.2)
        status, answer = await rerank(url, documents=["d" * (MiB // 2)])
        assert status == 200, answer
        dropped_status, dropped = await opened[0].answer(5)  # the oldest made room
        assert dropped_status == 408 and dropped["reason"] == "REQUEST_TIMEOUT", dropped
        assert "SIE_GATEWAY_HTTP_BODY_EVICT_AFTER_S" in dropped["message"], dropped
        for connection in opened[1:]:  # only as many as the newcomer needed
            assert await connection.unanswered_for(0.3)


async def test_a_body_that_has_all_arrived_is_never_dropped() -> None:
    gateway = Gateway()
    gateway.hold = True  # the whole body has arrived; its answer waits on the gateway
    env = {**BOUNDS, "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES": str(MiB), "SIE_GATEWAY_HTTP_BODY_EVICT_AFTER_S": "0.2"}
    async with running_adapter(gateway, env) as url:
        complete = asyncio.create_task(rerank(url, documents=["d" * (MiB - 4096)]))
        while not gateway.scores:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)
        status, answer = await rerank(url, documents=["d" * 65536])
        assert status == 503 and answer["reason"] == "OVERLOADED", answer
        gateway.release.set()
        status, answer = await complete
        assert status == 200, answer


def test_a_share_smaller_than_one_body_is_refused_at_start() -> None:
    with pytest.raises(SettingsError, match="SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES=1048575: at least"):
        load_settings(
            GatewaySettings,
            environ={
                "SIE_GATEWAY_HTTP_MAX_BODY_BYTES": str(MiB),
                "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES": str(MiB - 1),
            },
        )

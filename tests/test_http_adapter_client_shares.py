"""What one client address may hold of the HTTP adapter's body budget when no token is checked (SIE_AUTH_MODE=none,
the default). Before, such callers were all one caller bound by the whole budget only (every connection comes from
Envoy's address): one client sending bodies at once from many connections held all 256 MiB, every other caller got
503 OVERLOADED, and eviction never helped since its bodies had all arrived (issue 32, attack round 5, gap (c)). Now
Envoy names the client's own address in x-sie-client-address on every route to the adapter, over any value the client
sent (sie_stack.envoy_config), and one address holds at most SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES. In
process, over the stand-in gateway (http_adapter_in_process.py), the bounds scaled down; the header as Envoy sets it."""

from __future__ import annotations

import asyncio

import aiohttp

from http_adapter_in_process import JSON, RERANK, Gateway, MiB, running_adapter
from sie_common.edge.auth import CLIENT_ADDRESS_HEADER
from sie_stack.envoy_config import render
from test_http_adapter_body_share import Stalled, stalled_bodies

BOUNDS = {
    "SIE_GATEWAY_HTTP_MAX_BODY_BYTES": str(MiB),
    "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES": str(4 * MiB),
    "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES": str(2 * MiB),
}
BODY = {**RERANK, "documents": ["d" * (7 * MiB // 10)]}  # 0.7 MiB: two fit in one share, five in the budget


async def rerank(session: aiohttp.ClientSession, url: str, address: str | None) -> tuple[int, dict]:
    headers = {**JSON, **({CLIENT_ADDRESS_HEADER: address} if address else {})}
    async with session.post(url + "/v1/rerank", json=BODY, headers=headers) as response:
        return response.status, await response.json()


async def held_answers(gateway: Gateway, url: str, addresses: list[str | None]) -> list[tuple[int, dict]]:
    """The answers of one request from each of `addresses` at once, while the gateway holds every call it gets."""
    gateway.hold = True
    async with aiohttp.ClientSession() as session:
        calls = [asyncio.create_task(rerank(session, url, address)) for address in addresses]
        await asyncio.sleep(1.0)  # every body has arrived: in the gateway, or refused
        in_gateway = len(gateway.scores)
        gateway.release.set()
        answers = await asyncio.gather(*calls)
    assert in_gateway == sum(status == 200 for status, _ in answers)
    return answers


async def test_one_address_holds_its_share_and_another_address_is_still_served() -> None:
    gateway = Gateway()
    async with running_adapter(gateway, BOUNDS) as url:
        answers = await held_answers(gateway, url, ["10.0.0.1"] * 5 + ["10.0.0.2"])
    statuses = [status for status, _ in answers]
    assert statuses[:5].count(200) == 2, answers
    for status, answer in answers[:5]:
        if status != 200:
            assert status == 503 and answer["reason"] == "OVERLOADED", answer
            assert "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES" in answer["message"], answer
    assert statuses[5] == 200, answers[5]


async def test_a_connection_without_the_header_is_its_own_peer() -> None:
    gateway = Gateway()
    async with running_adapter(gateway, BOUNDS) as url:
        answers = await held_answers(gateway, url, [None] * 4 + ["10.0.0.3"])
    assert [status for status, _ in answers[:4]].count(200) == 2, answers
    assert answers[4][0] == 200, answers[4]


async def test_many_addresses_still_share_the_whole_budget() -> None:
    gateway = Gateway()
    async with running_adapter(gateway, BOUNDS) as url:
        answers = await held_answers(gateway, url, [f"10.0.1.{n}" for n in range(8)])
    assert [status for status, _ in answers].count(200) == 5, answers
    assert all(answer["reason"] == "OVERLOADED" for status, answer in answers if status != 200), answers


async def test_an_address_s_own_stalled_bodies_are_dropped_for_its_body_sent_at_once() -> None:
    # Its share is full of its own stalled bodies and the budget is not: before, the share refused its body for the
    # 30 s body timeout (every caller behind one proxy is one address, and a token shared by many clients is one).
    env = {**BOUNDS, "SIE_GATEWAY_HTTP_BODY_EVICT_AFTER_S": "1"}
    async with running_adapter(Gateway(), env) as url, stalled_bodies() as opened, aiohttp.ClientSession() as session:
        for _ in range(2):
            opened.append(await Stalled.open(url))  # no header: this connection's own address, 127.0.0.1
            await asyncio.sleep(0.1)
        status, answer = await rerank(session, url, "127.0.0.1")
        assert status == 503 and answer["reason"] == "OVERLOADED", answer  # none stalled for a second yet
        await asyncio.sleep(1.2)
        status, answer = await rerank(session, url, "127.0.0.1")
        assert status == 200, answer
        dropped_status, dropped = await opened[0].answer(5)
        assert dropped_status == 408 and dropped["reason"] == "REQUEST_TIMEOUT", dropped
        assert await opened[1].unanswered_for(0.3)  # only as many as the newcomer needed


def test_envoy_names_the_client_address_over_any_the_client_sent() -> None:
    config = render(listen_port=8080, admin_port=9901, gateway="g:1", config="c:2", adapter="a:3")
    (listener,) = config["static_resources"]["listeners"]
    (manager,) = listener["filter_chains"][0]["filters"]
    routes = manager["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    to_adapter = [route for route in routes if route.get("route", {}).get("cluster") == "adapter"]
    assert to_adapter
    for route in to_adapter:
        (added,) = route["request_headers_to_add"]
        assert added["header"] == {
            "key": CLIENT_ADDRESS_HEADER,
            "value": "%DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT%",
        }
        assert added["append_action"] == "OVERWRITE_IF_EXISTS_OR_ADD"

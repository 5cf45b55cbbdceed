"""The request check in front of Envoy's transcoder reads a body in one pass: a body it refuses is refused in time
linear in its size, whatever its shape, and Envoy keeps answering everyone else meanwhile. It refuses what the
contract refuses and the transcoder would take (a lone object for a list, a null item, "true" for a boolean).

Envoy runs alone (no gateway behind it): every body here is refused before anything would reach one."""

from __future__ import annotations

import json
import threading
import time

import pytest
from edge_load import MB, WORST_BODIES, request, running_edge

# Starts processes (its Envoy) in fixtures of its own.
pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    with running_edge(tmp_path_factory.mktemp("json-check")) as running:
        yield running


def refusal(status: int, body: bytes) -> tuple[int, str, dict]:
    got = json.loads(body)
    (info,) = got["details"]
    return status, info["reason"], info["metadata"]


def digits_then_a(digits: int) -> bytes:
    """The body that held Envoy for 12 s at 2,400 digits: the old number pattern backtracked over the digits."""
    return ('{"items":[{"text":"x"}],"dims":' + "1" * digits + "a}").encode()


def test_the_backtracking_body_is_refused_at_once(edge, reliability_report) -> None:
    for digits in (2_400, 60):
        status, seconds, body = request(edge.port, "POST", "/v1/encode/m", digits_then_a(digits))
        reliability_report.add("edge", f"JSON check: {digits} digits then 'a'", status=status, seconds=round(seconds, 3))
        expected = "NUMBER_TOO_LONG" if digits > 64 else "INVALID_JSON"
        assert refusal(status, body)[:2] == (400, expected)
        assert seconds < 1.0, f"{digits} digits took {seconds:.2f} s"


def test_while_hostile_bodies_are_checked_envoy_keeps_answering(edge) -> None:
    """Two attackers at once (the old filter held /healthz for 11.5 s with two): liveness answers within 2 s (a
    request behind a 4 MB body on the same Envoy thread waits for its check, some 0.3 s on 2 busy cores)."""
    bodies = [digits_then_a(2_400), (WORST_BODIES["escapes"](4 * MB) + "x").encode()]
    stop = threading.Event()

    def attack(body: bytes) -> None:
        while not stop.is_set():
            request(edge.port, "POST", "/v1/encode/m", body)

    attackers = [threading.Thread(target=attack, args=(body,)) for body in bodies]
    for attacker in attackers:
        attacker.start()
    try:
        slowest = 0.0
        for _ in range(10):
            status, seconds, _ = request(edge.port, "GET", "/healthz")
            assert status == 200
            slowest = max(slowest, seconds)
            time.sleep(0.2)
        assert slowest < 2.0, f"/healthz took {slowest:.2f} s under attack"
    finally:
        stop.set()
        for attacker in attackers:
            attacker.join()


@pytest.mark.parametrize("shape", sorted(WORST_BODIES))
def test_a_worst_body_is_refused_in_time_linear_in_its_size(edge, shape, reliability_report) -> None:
    """The same shape at 1 and at 8 MB, broken at its last byte (so the check reads all of it): 8 times the bytes may
    take at most 8 times as long, with slack for a busy machine, and never more than 250 ms per MB."""
    make = WORST_BODIES[shape]
    times = {}
    for size in (MB, 8 * MB):
        status, seconds, body = request(edge.port, "POST", "/v1/encode/m", (make(size) + "x").encode())
        assert status == 400, body[:300]
        assert refusal(status, body)[1] in {"INVALID_JSON", "TOO_MANY_VALUES", "NUMBER_TOO_LONG"}
        times[size] = seconds
    reliability_report.add(
        "edge", f"JSON check: {shape}", ms_per_mb_at_8mb=round(times[8 * MB] * 1000 / 8, 1), ms_at_1mb=round(times[MB] * 1000, 1)
    )
    assert times[8 * MB] < 8 * times[MB] * 3 + 0.5, times
    assert times[8 * MB] < 8 * 0.25, times


@pytest.mark.parametrize(
    ("body", "field", "expected"),
    [
        ({"items": {"text": "x"}}, "items", "an array"),
        ({"items": [{"text": "x"}, None]}, "items[1]", "a value (a list or a map holds no null)"),
        ({"items": [{"text": "x"}], "is_query": "true"}, "is_query", "true or false"),
        ({"items": [{"text": "x"}], "params": {"dims": [8]}}, "params.dims", "a number"),
        ({"items": [{"text": 42}]}, "items[0].text", "a string"),
        ({"items": [{"text": "x", "metadata": [1]}]}, "items[0].metadata", "an object"),
        ({"items": [{"images": {"data": "AA=="}}]}, "items[0].images", "an array"),
    ],
    ids=["items-object", "null-item", "bool-as-string", "number-as-list", "text-as-number", "metadata-as-list", "images-object"],
)
def test_a_value_of_the_wrong_json_type_is_refused_naming_its_field(edge, body, field, expected) -> None:
    status, _, got = request(edge.port, "POST", "/v1/encode/m", json.dumps(body).encode())
    assert refusal(status, got) == (400, "WRONG_JSON_TYPE", {"field": field, "expected": expected})
    assert f"field '{field}' must be {expected}" in json.loads(got)["message"]


def test_what_the_proto3_json_mapping_takes_passes_the_check(edge) -> None:
    """null for a field, a number as a string, an enum-free struct of anything: past the check (the unreachable
    gateway then answers 503 UPSTREAM_UNAVAILABLE, which proves the check let it through)."""
    for body in (
        {"items": [{"text": "x", "metadata": {"a": [None, {"b": 1}]}}], "dims": "8", "is_query": None, "params": None},
        {"items": [{"text": "x"}], "options": {"k": None}, "output_types": ["dense"]},
    ):
        status, _, got = request(edge.port, "POST", "/v1/encode/m", json.dumps(body).encode())
        assert refusal(status, got)[:2] == (503, "UPSTREAM_UNAVAILABLE"), got


def test_too_many_values_and_too_long_numbers_are_refused_before_the_transcoder(edge) -> None:
    many = '{"items":[' + ",".join(['{"text":"x"}'] * 40_000) + "]}"
    status, seconds, got = request(edge.port, "POST", "/v1/encode/m", many.encode())
    assert refusal(status, got) == (400, "TOO_MANY_VALUES", {"limit": "65536"})
    assert seconds < 2.0
    status, _, got = request(edge.port, "POST", "/v1/encode/m", b'{"items":[{"text":"x"}],"dims":"' + b"9" * 65 + b'"}')
    assert refusal(status, got)[:2] == (400, "NUMBER_TOO_LONG")

"""The request check's refusals are JSON whatever bytes the body held. An unknown key that is not UTF-8
(`{"\\x80tems": []}`) came back verbatim in the UNKNOWN_FIELD message and metadata, so the 400's body was not JSON at
all (found by test_edge_fuzz.py's generated bodies, issue 32 attack round 4). A byte past ASCII is now echoed as '?'.

Envoy alone, in front of a gateway nobody serves."""

from __future__ import annotations

import json

import pytest
from edge_load import request, running_edge

# Starts processes (its Envoy) in fixtures of its own.
pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    with running_edge(tmp_path_factory.mktemp("refusal-bytes")) as running:
        yield running


@pytest.mark.parametrize(
    ("body", "reason", "field"),
    [
        (b'{"\x80tems": []}', "UNKNOWN_FIELD", "?tems"),
        (b'{"items": [{"text": "x", "\xff\xfe": 1}]}', "UNKNOWN_FIELD", "items[0].??"),
        (b'{"\xc3\xadtems": []}', "UNKNOWN_FIELD", "??tems"),  # UTF-8, but no field of the contract has it
        (b'{"items": [], "items": [], "\xc0": 1}', "DUPLICATE_FIELD", "items"),
    ],
)
def test_a_refusal_quoting_bytes_past_ascii_is_json(edge, body: bytes, reason: str, field: str) -> None:
    status, _, answer = request(edge.port, "POST", "/v1/encode/m", body)
    info = json.loads(answer.decode("utf-8"))["details"][0]
    assert (status, info["reason"], info["metadata"]["field"]) == (400, reason, field)

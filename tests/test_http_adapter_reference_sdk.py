"""The reference SDK itself (sie-sdk 0.10.1 from PyPI, unmodified, in its own Python 3.12 venv) against a real
`sie up`, over its own msgpack wire (the gateway's HTTP adapter behind Envoy): encode (one item, a list, dense,
sparse, multivector, output dtypes), score, extract, list_models, get_model, capacity, pools, and its errors; every
answer equal to sie_client's on the same stack, on the keys the reference gives."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adapter_stack import COLBERT, MINILM, NER, RERANKER, SPLADE, adapter_stack
from reference_sdk import reference_python
from reference_sdk_calls import answers

# Starts processes (a `sie up` and the reference SDK's Python) in fixtures of its own.
pytestmark = pytest.mark.process

CALLS_SCRIPT = Path(__file__).with_name("reference_sdk_calls.py")
ITEMS = [{"id": "a", "text": "how do vector databases work?"}, {"text": "a second text without an id"}]


@pytest.fixture(scope="module")
def python() -> str:
    found, why_not = reference_python()
    if found is None:
        pytest.skip(why_not)
    return found


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_models):
    # One worker: the pool test's pool may take it (SIE_POOL_SHARED_WORKERS=0, SIE_POOL_MAX_SHARE=1).
    pools = {"SIE_POOLS_ENABLED": "true", "SIE_POOL_SHARED_WORKERS": "0", "SIE_POOL_MAX_SHARE": "1"}
    with adapter_stack(tmp_path_factory.mktemp("reference-sdk"), tiny_models, **pools) as running:
        yield running


def both(python: str, base_url: str, calls: list[list[Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the reference SDK's answers, sie_client's) to the same calls."""
    done = subprocess.run(
        [python, str(CALLS_SCRIPT), "sie_sdk", base_url, json.dumps(calls)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), answers("sie_client", base_url, calls)


def assert_same(reference: Any, ours: Any, where: str = "") -> None:
    """Every key the reference's answer has, with the same value in ours (numbers to float32 precision)."""
    if isinstance(reference, dict) and "array" in reference:
        assert ours["dtype"] == reference["dtype"] and ours["shape"] == reference["shape"], where
        np.testing.assert_allclose(ours["array"], reference["array"], atol=1e-4, err_msg=where)
    elif isinstance(reference, dict):
        assert isinstance(ours, dict), (where, ours)
        for key, value in reference.items():
            if key in ("timing", "request"):  # per call, not per answer
                continue
            if value is None and key not in ours:  # the reference's entity bbox: None for a text span
                continue
            assert key in ours, (where, key, sorted(ours))
            assert_same(value, ours[key], f"{where}.{key}")
    elif isinstance(reference, list):
        assert isinstance(ours, list) and len(ours) == len(reference), (where, ours)
        for index, (left, right) in enumerate(zip(reference, ours, strict=True)):
            assert_same(left, right, f"{where}[{index}]")
    elif isinstance(reference, float):
        assert ours == pytest.approx(reference, abs=1e-4), where
    else:
        assert ours == reference, where


def test_encode_score_extract_equal_sie_client(stack, python) -> None:
    calls = [
        ["one item", "encode", [MINILM, ITEMS[0]], {}],
        ["a list", "encode", [MINILM, ITEMS], {}],
        ["query", "encode", [MINILM, ITEMS], {"is_query": True}],
        ["float16", "encode", [MINILM, ITEMS], {"output_dtype": "float16"}],
        ["int8", "encode", [MINILM, ITEMS], {"output_dtype": "int8"}],
        ["binary", "encode", [MINILM, ITEMS], {"output_dtype": "binary"}],
        ["sparse", "encode", [SPLADE, ITEMS], {"output_types": ["sparse"]}],
        ["multivector", "encode", [COLBERT, ITEMS], {"output_types": ["multivector"]}],
        ["score", "score", [RERANKER, {"id": "q", "text": "vector databases"}, ITEMS], {}],
        ["late interaction", "score", [COLBERT, {"text": "vector databases"}, ITEMS], {}],
        ["extract", "extract", [NER, [{"text": "Ada Lovelace met Charles Babbage in London."}]], {}],
        ["extract one", "extract", [NER, {"text": "Paris is in France."}], {}],
    ]
    reference, ours = both(python, stack.http, calls)
    for name, *_ in calls:
        assert "raises" not in reference[name], (name, reference[name])
        assert_same(reference[name], ours[name], name)
    assert reference["one item"]["dense"]["shape"] == [384] and reference["one item"]["model"] == MINILM
    assert [result["id"] for result in reference["a list"]] == ["a", "item-1"]
    assert reference["float16"][0]["dense"]["dtype"] == "float16"
    assert reference["int8"][0]["dense"]["dtype"] == "int8"
    assert reference["sparse"][0]["sparse"]["indices"]["dtype"] == "int32"
    assert reference["multivector"][0]["multivector"]["shape"][1] > 0
    scores = reference["score"]["scores"]
    assert [entry["rank"] for entry in scores] == [0, 1] and reference["score"]["query_id"] == "q"
    assert scores[0]["score"] >= scores[1]["score"]
    assert reference["score"]["usage"] == ours["score"]["usage"] and reference["score"]["usage"]["input_tokens"] > 0
    assert set(reference["extract"][0]) >= {"entities", "relations", "classifications", "objects"}
    # a query encodes differently from a document only where the model has a query template; the answer is equal
    # to sie_client's either way (above)


def wait_for_settled_models(base_url: str, timeout_s: float = 30.0) -> None:
    """Until two lists 1 s apart are equal: a worker reports the models it loaded a moment after the requests that
    loaded them are answered, so a list taken just after another test's requests may still be changing."""
    list_call = [["list", "list_models", [], {}]]
    previous = answers("sie_client", base_url, list_call)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(1.0)
        current = answers("sie_client", base_url, list_call)
        if current == previous:
            return
        previous = current
    raise AssertionError(f"the model list kept changing for {timeout_s} s: {previous}")


def test_models_and_capacity_equal_sie_client(stack, python) -> None:
    wait_for_settled_models(stack.http)
    calls = [
        ["list", "list_models", [], {}],
        ["get", "get_model", [MINILM], {}],
        ["capacity", "get_capacity", [], {}],
        ["wait", "wait_for_capacity", ["default"], {"model": MINILM, "timeout_s": 120, "poll_interval_s": 0.5}],
    ]
    reference, ours = both(python, stack.http, calls)
    for name in ("list", "get"):
        assert "raises" not in reference[name], reference[name]
        assert_same(reference[name], ours[name], name)
    by_name = {model["name"]: model for model in reference["list"]}
    assert set(by_name) >= {MINILM, SPLADE, COLBERT, RERANKER, NER}
    assert by_name[MINILM]["state"] == "loaded" and by_name[MINILM]["loaded"] is True
    assert reference["get"]["dims"] == {"dense": 384} and reference["get"]["profiles"]["default"]["is_default"]
    capacity = reference["capacity"]
    assert capacity["status"] == "healthy" and capacity["worker_count"] == 1, capacity
    assert MINILM in capacity["workers"][0]["loaded_models"]
    for key in ("status", "worker_count", "gpu_count", "models_loaded", "workers"):
        assert_same(capacity[key], ours["capacity"][key], key)
    # waits for the machine profile by encoding there; the API names no worker's profile, so none is counted
    assert "raises" not in reference["wait"] and reference["wait"]["worker_count"] == 0, reference["wait"]


def test_errors_are_the_reference_sdks_classes(stack, python) -> None:
    calls = [
        ["unknown model", "encode", ["no/such-model", {"text": "x"}], {}],
        ["generate", "generate", [MINILM, "hello"], {"max_new_tokens": 8}],
        ["jobs", "jobs.list", [], {}],
        ["unsupported input", "encode", [MINILM, {"text": "x", "audio": b"RIFF"}], {}],
    ]
    done = subprocess.run(
        [python, str(CALLS_SCRIPT), "sie_sdk", stack.http, json.dumps(calls, default=str)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    reference = json.loads(done.stdout)
    assert reference["unknown model"]["raises"] == "RequestError", reference
    assert reference["unknown model"]["status_code"] == 404 and reference["unknown model"]["code"] == "MODEL_NOT_FOUND"
    assert reference["generate"]["raises"] == "ServerError" and reference["generate"]["status_code"] == 501
    assert (
        reference["generate"]["code"] == "NOT_SUPPORTED"
        and "not supported by this engine" in reference["generate"]["message"]
    )
    assert reference["jobs"]["status_code"] == 501 and reference["jobs"]["code"] == "NOT_SUPPORTED", reference["jobs"]
    assert reference["unsupported input"]["status_code"] == 400, reference["unsupported input"]
    assert reference["unsupported input"]["code"] == "NOT_SUPPORTED"


def test_pools_through_the_reference_sdk(stack, python) -> None:
    """Last in this file: the pool reserves the stack's only worker while it lives."""
    calls = [
        ["create", "create_pool", ["refpool", {"default": 1}], {}],
        ["get", "get_pool", ["refpool"], {}],
        [
            "encode in pool",
            "encode",
            [MINILM, {"text": "pooled"}],
            {"gpu": "refpool/default", "provision_timeout_s": 60},
        ],
        ["delete", "delete_pool", ["refpool"], {}],
        ["get deleted", "get_pool", ["refpool"], {}],
        ["delete again", "delete_pool", ["refpool"], {}],
    ]
    done = subprocess.run(
        [python, str(CALLS_SCRIPT), "sie_sdk", stack.http, json.dumps(calls)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reference = json.loads(done.stdout)
    assert reference["create"] is None, reference
    assert reference["get"]["name"] == "refpool" and reference["get"]["spec"]["gpus"] == {"default": 1}
    assert reference["get"]["status"]["state"] in ("active", "pending")
    assert reference["encode in pool"]["dense"]["shape"] == [384], reference["encode in pool"]
    assert reference["delete"] is True and reference["get deleted"] is None and reference["delete again"] is False

"""Adversarial `params` messages and field-like `options` keys straight to one worker (no gateway in front).

Every case must be a precise INVALID_ARGUMENT with a reason (never INTERNAL, never a hang), the error must fit
the caller's default trailer limit (8 KiB of metadata), and the worker must answer a known request afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from google.protobuf import struct_pb2
from grpc_helpers import error_info, stacked
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from worker_process import inference_stub

KNOWN_MODEL = "test/tiny-mean"
EXTRACT_MODEL = "test/tiny-ner"
DEADLINE_S = 30


@pytest.fixture(scope="module")
def params_worker(start_module_worker) -> Iterator:
    worker = start_module_worker(SIE_PRELOAD_MODELS=f"{KNOWN_MODEL},{EXTRACT_MODEL}")
    yield worker
    worker.kill()


@pytest.fixture(scope="module")
def params_stub(params_worker) -> Iterator[inference_pb2_grpc.InferenceStub]:
    # default client options: an error whose trailers pass 8 KiB would reach this caller as INTERNAL
    with inference_stub(params_worker) as stub:
        yield stub


def known(stub) -> np.ndarray:
    request = inference_pb2.EncodeRequest(
        model=KNOWN_MODEL, items=[types_pb2.Item(text="a known request")]
    )
    return stacked(
        result.dense for result in stub.Encode(request, timeout=DEADLINE_S).results
    )


@pytest.fixture(scope="module")
def reference(params_stub) -> np.ndarray:
    return known(params_stub)


def struct(values: dict) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(values)
    return value


def nested(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth):
        value = {"a": value}
    return value


ITEMS = [types_pb2.Item(text="x")]
E, EP = inference_pb2.EncodeRequest, inference_pb2.EncodeParams
X, XP = inference_pb2.ExtractRequest, inference_pb2.ExtractParams
BIG_KEY = "k" * 8000  # under SIE_MAX_OPTIONS_BYTES (16 KiB) in each place, over SIE_MAX_NAME_BYTES

CASES = {
    "params.instruction over the bound": (
        "Encode",
        E(model=KNOWN_MODEL, items=ITEMS, params=EP(instruction="i" * 20000)),
        "INSTRUCTION_TOO_LONG",
    ),
    "options.instruction over the bound": (
        "Encode",
        E(model=KNOWN_MODEL, items=ITEMS, options=struct({"instruction": "i" * 17000})),
        "OPTIONS_TOO_LARGE",
    ),
    "params.options 12 deep": (
        "Encode",
        E(model=KNOWN_MODEL, items=ITEMS, params=EP(options=struct(nested(12)))),
        "OPTIONS_TOO_LARGE",
    ),
    "options and params.options each under, together over": (
        "Encode",
        E(
            model=KNOWN_MODEL,
            items=ITEMS,
            options=struct({"a": "v" * 9000}),
            params=EP(options=struct({"b": "v" * 9000})),
        ),
        "OPTIONS_TOO_LARGE",
    ),
    "params.dims negative": (
        "Encode",
        E(model=KNOWN_MODEL, items=ITEMS, params=EP(dims=-5)),
        "INVALID_DIMS",
    ),
    "params.dims 2**31-1 (answered RESOURCE_EXHAUSTED, an 8 GB answer)": (
        "Encode",
        E(model=KNOWN_MODEL, items=ITEMS, params=EP(dims=2**31 - 1)),
        "DIMS_TOO_LARGE",
    ),
    "params.output_types one unknown of 1 MB": (
        "Encode",
        E(model=KNOWN_MODEL, items=ITEMS, params=EP(output_types=["d" * 2**20])),
        "UNKNOWN_OUTPUT_TYPE",
    ),
    "params.output_dtype of 1 MB": (
        "Encode",
        E(model=KNOWN_MODEL, items=ITEMS, params=EP(output_dtype="d" * 2**20)),
        "UNKNOWN_OUTPUT_DTYPE",
    ),
    "options.is_query a string": (
        "Encode",
        E(model=KNOWN_MODEL, items=ITEMS, options=struct({"is_query": "yes"})),
        "INVALID_OPTIONS",
    ),
    "is_query true and options false": (
        "Encode",
        E(
            model=KNOWN_MODEL,
            items=ITEMS,
            is_query=True,
            options=struct({"is_query": False}),
        ),
        "CONFLICTING_OPTIONS",
    ),
    "options key of 8 KB in both places, values differ (a key is a name: SIE_MAX_NAME_BYTES)": (
        "Encode",
        E(
            model=KNOWN_MODEL,
            items=ITEMS,
            options=struct({BIG_KEY: 1}),
            params=EP(options=struct({BIG_KEY: 2})),
        ),
        "KEY_TOO_LONG",
    ),
    "an option key in both places, values differ": (
        "Encode",
        E(
            model=KNOWN_MODEL,
            items=ITEMS,
            options=struct({"is_query": True}),
            params=EP(options=struct({"is_query": False})),
        ),
        "CONFLICTING_OPTIONS",
    ),
    "params.labels over SIE_MAX_LABELS": (
        "Extract",
        X(
            model=EXTRACT_MODEL,
            items=ITEMS,
            params=XP(labels=[f"l{i}" for i in range(129)]),
        ),
        "TOO_MANY_LABELS",
    ),
    "a label of 1 MB": (
        "Extract",
        X(model=EXTRACT_MODEL, items=ITEMS, params=XP(labels=["l" * 2**20])),
        "NAME_TOO_LONG",
    ),
    "threshold NaN in both places (answered CONFLICTING_OPTIONS: NaN != NaN)": (
        "Extract",
        X(model=EXTRACT_MODEL, items=ITEMS, threshold=float("nan"), params=XP(threshold=float("nan"))),
        "INVALID_THRESHOLD",
    ),
    "params.threshold NaN": (
        "Extract",
        X(model=EXTRACT_MODEL, items=ITEMS, params=XP(threshold=float("nan"))),
        "INVALID_THRESHOLD",
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_params_are_refused_precisely(params_stub, reference, case) -> None:
    method, request, reason = CASES[case]
    with pytest.raises(grpc.RpcError) as raised:
        getattr(params_stub, method)(request, timeout=DEADLINE_S)
    error = raised.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (
        f"{error.code().name}: {error.details()[:300]}"
    )
    assert error_info(error).reason == reason, error.details()[:300]
    assert len(error.details()) < 2048
    np.testing.assert_array_equal(known(params_stub), reference)


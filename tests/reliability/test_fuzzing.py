"""Property-based fuzzing of request messages against the standalone worker: whatever the request, the
answer is a result or a precise refusal (never INTERNAL or UNKNOWN), the worker stays up, and it still
answers a known request exactly as before."""

from __future__ import annotations

import grpc
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import LORA_MODEL, MINILM
from grpc_helpers import call_until_loaded, encode_request, stacked
from sie.v1 import inference_pb2, types_pb2

EXAMPLES_PER_MESSAGE = 120
# Served and preloaded by the session worker, so examples run models rather than wait for loads.
ENCODERS = ["test/tiny-mean", "test/tiny-cls", "test/tiny-splade", "test/tiny-colbert", LORA_MODEL, MINILM]
SCORERS = ["test/tiny-reranker", "test/tiny-colbert"]
EXTRACTORS = ["test/tiny-ner"]
UNACCEPTABLE = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)

# Valid unicode (protobuf strings cannot hold lone surrogates), with the edge cases weighted in.
texts = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=200),
    st.sampled_from(["", " ", "\x00", "\u200b\u200d", "🧪" * 50, "ﷺ" * 30, "a\u0301" * 40, "\ufeff", "\U0010ffff", "x" * 5000]),
)
names = st.one_of(st.text(max_size=20, alphabet=st.characters(exclude_categories=("Cs",))), st.sampled_from(["dense", "sparse", "multivector", "float16", "int8", "ubinary"]))
json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=10, alphabet=st.characters(exclude_categories=("Cs",))),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8, alphabet=st.characters(exclude_categories=("Cs",))), children, max_size=3),
    max_leaves=8,
)
option_keys = st.one_of(st.sampled_from(["lora", "muvera", "pooling", "normalize", "seed"]), st.text(max_size=8, alphabet=st.characters(exclude_categories=("Cs",))))
options = st.dictionaries(option_keys, json_values, max_size=3)
int32 = st.integers(-(2**31), 2**31 - 1)


@st.composite
def item(draw) -> types_pb2.Item:
    message = types_pb2.Item(id=draw(st.text(max_size=12, alphabet=st.characters(exclude_categories=("Cs",)))))
    text = draw(st.one_of(texts, texts, texts, st.none()))
    if text is not None:
        message.text = text
    for _ in range(draw(st.integers(0, 1))):
        message.images.add(data=draw(st.binary(max_size=64)), format=draw(st.sampled_from(["", "png", "jpeg", "gif?"])))
    return message


def _common(draw, request, models: list[str]) -> None:
    request.model = draw(st.sampled_from(models) | st.text(max_size=40, alphabet=st.characters(exclude_categories=("Cs",))))
    request.profile = draw(st.sampled_from(["", "", "", "default", "turbo"]))
    request.lora = draw(st.sampled_from(["", "", "", "", "alpha", "beta", "nope"]))
    request.request_id = draw(st.text(max_size=10, alphabet=st.characters(exclude_categories=("Cs",))))
    request.options.update(draw(st.one_of(st.just({}), st.just({}), options)))


@st.composite
def encode_requests(draw) -> inference_pb2.EncodeRequest:
    request = inference_pb2.EncodeRequest(items=draw(st.lists(item(), max_size=6)))
    _common(draw, request, ENCODERS)
    request.output_types.extend(draw(st.lists(names, max_size=3)))
    request.output_dtype = draw(st.sampled_from(["", "float32", "float16", "int8", "uint8", "binary", "ubinary"]) | names)
    if draw(st.booleans()):
        request.dims = draw(st.sampled_from([1, 8, 16, 32, 384, 0, -1]) | int32)
    if draw(st.booleans()):
        request.instruction = draw(texts)
    request.is_query = draw(st.booleans())
    return request


@st.composite
def score_requests(draw) -> inference_pb2.ScoreRequest:
    request = inference_pb2.ScoreRequest(items=draw(st.lists(item(), max_size=6)))
    _common(draw, request, SCORERS)
    if draw(st.sampled_from([True, True, True, False])):
        request.query.CopyFrom(draw(item()))
    if draw(st.booleans()):
        request.top_k = draw(st.sampled_from([0, 1, 3, -1]) | int32)
    if draw(st.booleans()):
        request.instruction = draw(texts)
    return request


@st.composite
def extract_requests(draw) -> inference_pb2.ExtractRequest:
    request = inference_pb2.ExtractRequest(items=draw(st.lists(item(), max_size=6)))
    _common(draw, request, EXTRACTORS)
    request.labels.extend(draw(st.lists(names, max_size=4)))
    if draw(st.booleans()):
        request.threshold = draw(st.floats(width=32, allow_nan=True, allow_infinity=True))
    return request


def test_fuzzed_requests_never_crash_the_worker(stub, reliability_report) -> None:
    known = ["a known request", "answered the same after fuzzing"]
    before, _ = call_until_loaded(lambda: stub.Encode(encode_request("test/tiny-mean", known), timeout=60))
    counts: dict[str, int] = {}
    codes: dict[str, set[str]] = {}

    def check(kind: str, call, request) -> None:
        counts[kind] = counts.get(kind, 0) + 1
        try:
            call(request, timeout=60)
            code = grpc.StatusCode.OK
        except grpc.RpcError as error:
            code = error.code()
            assert code not in UNACCEPTABLE, f"{kind} answered {code.name}: {error.details()}\n{request}"
        codes.setdefault(kind, set()).add(code.name)

    fuzz = settings(max_examples=EXAMPLES_PER_MESSAGE, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    fuzz(given(encode_requests())(lambda request: check("EncodeRequest", stub.Encode, request)))()
    fuzz(given(score_requests())(lambda request: check("ScoreRequest", stub.Score, request)))()
    fuzz(given(extract_requests())(lambda request: check("ExtractRequest", stub.Extract, request)))()

    after = stub.Encode(encode_request("test/tiny-mean", known), timeout=60)
    np.testing.assert_array_equal(stacked(r.dense for r in after.results), stacked(r.dense for r in before.results))
    for kind, count in counts.items():
        print(f"fuzzing {kind}: {count} examples, statuses {sorted(codes[kind])}")
        reliability_report.add("fuzzing", kind, examples=count, failures=0, statuses="/".join(sorted(codes[kind])))
    assert all(count >= EXAMPLES_PER_MESSAGE for count in counts.values())

"""Adversarial input against one worker (issue 20, worker side): every request field has an upper bound checked
before any work, and one caller's bad item fails only its own request.

Each case asserts the exact status and reason, that the worker still answers a known request exactly as
before, and, where memory was at stake, that the worker's peak RSS (VmHWM) grew by less than a stated bound.
The worker runs with tight bounds where a case needs a small limit to stay cheap, and the defaults elsewhere
(MUVERA, aspect ratio, request timeout)."""

from __future__ import annotations

import io
import math
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from google.protobuf import duration_pb2, struct_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from grpc_helpers import error_details, error_info, stacked
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc

KNOWN_MODEL = "test/tiny-mean"
KNOWN = ["a known request", "answered the same after every adversarial one"]
# A config whose max_sequence_length (4096) is above the model's 128-row position table.
LONG_CONFIG_MODEL = "test/tiny-long-config"
# A model whose embedding table (20,000 rows) is smaller than its tokenizer's vocabulary (30,522 ids).
SHORT_VOCAB_MODEL = "test/tiny-short-vocab"
SHORT_VOCAB_ROWS = 20_000
INNOCENT_TEXT = "hello world"  # token ids 7592, 2088
POISON_TEXT = "zebra xylophone"  # "zebra" is token 29145: past the table
TIGHT = {
    "SIE_MAX_ITEMS_PER_REQUEST": "64",
    "SIE_MAX_TEXT_BYTES": "4096",
    "SIE_MAX_INSTRUCTION_BYTES": "64",
    "SIE_MAX_NAME_BYTES": "32",
    "SIE_MAX_LABELS": "4",
    "SIE_MAX_OPTIONS_BYTES": "512",
    "SIE_MAX_OPTIONS_DEPTH": "4",
    "SIE_MAX_IMAGE_BYTES": "65536",
}
PRELOADED = (KNOWN_MODEL, "test/tiny-colbert", "test/tiny-clip", "test/tiny-ner", "test/tiny-reranker", LONG_CONFIG_MODEL, SHORT_VOCAB_MODEL)
# Peak RSS growth allowed where the defect cost gigabytes.
RSS_BOUND_BYTES = 200 * 2**20
DEADLINE_S = 30


def peak_rss(pid: int) -> int:
    """VmHWM of a process: the most resident memory it has had, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture(scope="module")
def adversarial_models(tmp_path_factory: pytest.TempPathFactory, models_dir: Path, tiny_models: dict[str, Path]) -> Path:
    """The session's model configs plus the two models of defect 8."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    directory = tmp_path_factory.mktemp("adversarial-configs")
    for config in models_dir.glob("*.yaml"):
        (directory / config.name).write_text(config.read_text())
    (directory / "test--tiny-long-config.yaml").write_text(
        f"id: {LONG_CONFIG_MODEL}\npath: {tiny_models[KNOWN_MODEL]}\nmax_sequence_length: 4096\n"
        "profiles:\n  default:\n    adapter: sentence_transformer\n"
    )
    weights = tmp_path_factory.mktemp("short-vocab")
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["test/tiny-reranker"])
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=SHORT_VOCAB_ROWS, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=128
    )
    BertModel(config).save_pretrained(weights)
    tokenizer.save_pretrained(weights)
    (directory / "test--tiny-short-vocab.yaml").write_text(
        f"id: {SHORT_VOCAB_MODEL}\npath: {weights}\nprofiles:\n  default:\n    adapter: sentence_transformer\n"
    )
    return directory


@pytest.fixture(scope="module")
def bounded(start_module_worker, adversarial_models: Path) -> Iterator:
    """A worker with tight bounds and a 300 ms batch window (concurrent requests share forward passes).

    Killed at the end of the module: on code without the bounds, a case may leave it looping."""
    worker = start_module_worker(
        SIE_MODELS_DIR=str(adversarial_models), SIE_PRELOAD_MODELS=",".join(PRELOADED), SIE_ADAPTIVE_BATCHING="false", SIE_MAX_BATCH_WAIT_MS="300", **TIGHT
    )
    yield worker
    worker.kill()


@pytest.fixture(scope="module")
def bounded_stub(bounded) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with grpc.insecure_channel(bounded.address, options=[("grpc.max_receive_message_length", 64 * 2**20)]) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


def known(stub) -> np.ndarray:
    request = inference_pb2.EncodeRequest(model=KNOWN_MODEL, items=[types_pb2.Item(text=text) for text in KNOWN])
    return stacked(result.dense for result in stub.Encode(request, timeout=DEADLINE_S).results)


@pytest.fixture(scope="module")
def reference(bounded_stub) -> np.ndarray:
    return known(bounded_stub)


def refused(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call(request, timeout=DEADLINE_S)
    return raised.value


def outcome(error: grpc.RpcError) -> str:
    """How the report shows a refusal: its status and, when it carries one, its reason."""
    info, _ = error_details(error)
    return f"{error.code().name} {info.reason}" if info is not None else error.code().name


def assert_refused(error: grpc.RpcError, reason: str, **metadata: str) -> None:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{error.code().name}: {error.details()}"
    info = error_info(error)
    assert info.reason == reason, error.details()
    for key, value in metadata.items():
        assert info.metadata[key] == value, dict(info.metadata)


def options(values: dict) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(values)
    return struct


# --- defect 1: MUVERA options -------------------------------------------------------------------------------

MUVERA_CASES = {
    "repetitions 1e18 (looped past the deadline, ~40 MB/s)": ({"repetitions": 1e18}, "repetitions", "SIE_MAX_MUVERA_REPETITIONS"),
    "d_proj 200000 (peaked at 10 GB)": ({"d_proj": 200000}, "d_proj", "SIE_MAX_MUVERA_D_PROJ"),
    "d_proj 1e18 (answered INTERNAL)": ({"d_proj": 1e18}, "d_proj", "SIE_MAX_MUVERA_D_PROJ"),
    "each under its bound, the product over": ({"k_sim": 10, "d_proj": 64, "repetitions": 8}, "dims", "SIE_MAX_MUVERA_DIMS"),
}


@pytest.mark.parametrize("case", MUVERA_CASES, ids=list(MUVERA_CASES))
def test_muvera_parameters_are_bounded_before_any_work(bounded, bounded_stub, reference, case, reliability_report) -> None:
    muvera, parameter, setting = MUVERA_CASES[case]
    before = peak_rss(bounded.process.pid)
    request = inference_pb2.EncodeRequest(
        model="test/tiny-colbert",
        items=[types_pb2.Item(text="late interaction " * 20)] * 8,
        output_types=["dense"],  # MUVERA: without output types a ColBERT model answers multivectors
        options=options({"muvera": muvera}),
    )
    error = refused(bounded_stub.Encode, request)
    reliability_report.add("adversarial bounds", f"MUVERA {case}", expected="INVALID_ARGUMENT INVALID_OPTIONS", actual=outcome(error))
    assert_refused(error, "INVALID_OPTIONS", parameter=parameter, setting=setting)
    assert peak_rss(bounded.process.pid) - before < RSS_BOUND_BYTES
    np.testing.assert_array_equal(known(bounded_stub), reference)


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, "seven", True])
def test_muvera_seed_must_be_a_non_negative_integer(bounded_stub, seed) -> None:
    request = inference_pb2.EncodeRequest(
        model="test/tiny-colbert", items=[types_pb2.Item(text="x")], output_types=["dense"], options=options({"muvera": {"seed": seed}})
    )
    assert_refused(refused(bounded_stub.Encode, request), "INVALID_OPTIONS")


# --- defect 2: image aspect-ratio bomb ------------------------------------------------------------------------


def thin_png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (width, height), 128).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("size", [(1, 1_000_000), (1, 300_000), (60_000, 1)], ids=["1x1000000 (10 GB, 57 s)", "1x300000 (3.5 GB)", "60000x1"])
def test_image_aspect_ratio_bomb_is_refused_from_the_header(bounded, bounded_stub, reference, size, reliability_report) -> None:
    data = thin_png(*size)
    assert len(data) < 8192  # a few KB of PNG
    before = peak_rss(bounded.process.pid)
    request = inference_pb2.EncodeRequest(model="test/tiny-clip", items=[types_pb2.Item(id="thin", images=[types_pb2.Image(data=data)])])
    error = refused(bounded_stub.Encode, request)
    reliability_report.add("adversarial bounds", f"image {size[0]}x{size[1]} PNG", expected="INVALID_ARGUMENT IMAGE_ASPECT_RATIO_TOO_LARGE", actual=outcome(error))
    assert_refused(error, "IMAGE_ASPECT_RATIO_TOO_LARGE", setting="SIE_MAX_IMAGE_ASPECT_RATIO", limit="50", item="0", item_id="thin")
    assert "aspect ratio of" in error.details()
    assert peak_rss(bounded.process.pid) - before < RSS_BOUND_BYTES
    np.testing.assert_array_equal(known(bounded_stub), reference)


def test_an_image_over_the_byte_bound_is_refused_before_decoding(bounded_stub) -> None:
    data = thin_png(16, 16) + b"\x00" * 70_000  # a valid PNG with trailing bytes: the size alone decides
    request = inference_pb2.EncodeRequest(model="test/tiny-clip", items=[types_pb2.Item(images=[types_pb2.Image(data=data)])])
    assert_refused(refused(bounded_stub.Encode, request), "IMAGE_TOO_LARGE", setting="SIE_MAX_IMAGE_BYTES", limit="65536")


def test_a_moderate_aspect_ratio_is_still_answered(bounded_stub) -> None:
    request = inference_pb2.EncodeRequest(model="test/tiny-clip", items=[types_pb2.Item(images=[types_pb2.Image(data=thin_png(40, 1000))])])
    response = bounded_stub.Encode(request, timeout=DEADLINE_S)
    assert np.isfinite(stacked([response.results[0].dense])).all()


# --- defect 8: one bad item, many callers ----------------------------------------------------------------------


def concurrently(stub, requests: list[inference_pb2.EncodeRequest]) -> list[object]:
    """Send every request at once (they meet in the 300 ms batch window); each one's response or RpcError."""
    outcomes: list[object] = [None] * len(requests)
    barrier = threading.Barrier(len(requests))

    def send(index: int) -> None:
        barrier.wait()
        try:
            outcomes[index] = stub.Encode(requests[index], timeout=DEADLINE_S)
        except grpc.RpcError as error:
            outcomes[index] = error

    threads = [threading.Thread(target=send, args=(index,)) for index in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_token_length_is_capped_at_the_position_table(bounded_stub, reference, reliability_report) -> None:
    """A config max_sequence_length (4096) above the model's 128 positions: the long item is truncated, and the
    innocent requests batched with it are answered."""
    described = bounded_stub.GetModel(inference_pb2.GetModelRequest(model=LONG_CONFIG_MODEL), timeout=DEADLINE_S).model
    assert described.max_sequence_length == 128
    innocent = [inference_pb2.EncodeRequest(model=LONG_CONFIG_MODEL, items=[types_pb2.Item(text=f"short text {n}")]) for n in range(19)]
    long = inference_pb2.EncodeRequest(model=LONG_CONFIG_MODEL, items=[types_pb2.Item(text="word " * 600)])
    outcomes = concurrently(bounded_stub, [*innocent, long])
    failed = [outcome for outcome in outcomes if isinstance(outcome, grpc.RpcError)]
    reliability_report.add("adversarial bounds", "config max_sequence_length above the position table", requests=len(outcomes), failed=len(failed))
    assert not failed, [(error.code().name, error.details()) for error in failed]
    assert outcomes[-1].tokens == 128
    np.testing.assert_array_equal(known(bounded_stub), reference)


def test_a_failing_item_fails_only_its_own_request(bounded_stub, reference, reliability_report) -> None:
    """An item the model cannot run (a token id past its embedding table) in a batch with 19 innocent requests:
    they are answered, its own request gets INVALID_ARGUMENT ITEM_FAILED."""
    innocent = [inference_pb2.EncodeRequest(model=SHORT_VOCAB_MODEL, items=[types_pb2.Item(text=INNOCENT_TEXT)]) for _ in range(19)]
    poisoned = inference_pb2.EncodeRequest(model=SHORT_VOCAB_MODEL, items=[types_pb2.Item(text=INNOCENT_TEXT), types_pb2.Item(text=POISON_TEXT)])
    bounded_stub.Encode(innocent[0], timeout=DEADLINE_S)  # the model has run: a failure is not the model's
    outcomes = concurrently(bounded_stub, [*innocent, poisoned])
    failed_innocent = [outcome for outcome in outcomes[:-1] if isinstance(outcome, grpc.RpcError)]
    reliability_report.add("adversarial bounds", "one failing item among 20 co-batched requests", innocent_failed=len(failed_innocent))
    assert not failed_innocent, [(error.code().name, error.details()) for error in failed_innocent]
    expected = stacked([outcomes[0].results[0].dense])
    for response in outcomes[:-1]:
        np.testing.assert_allclose(stacked([response.results[0].dense]), expected, atol=1e-5)
    assert isinstance(outcomes[-1], grpc.RpcError)
    assert_refused(outcomes[-1], "ITEM_FAILED")  # whether the item ran with others or, batched alone, after them
    assert "check the item's input" in outcomes[-1].details()
    alone = refused(bounded_stub.Encode, inference_pb2.EncodeRequest(model=SHORT_VOCAB_MODEL, items=[types_pb2.Item(text=POISON_TEXT)]))
    assert_refused(alone, "ITEM_FAILED")  # batched alone, on a model that answers others: still the item's fault
    np.testing.assert_array_equal(known(bounded_stub), reference)


def test_a_long_score_query_is_tokenized_once_with_the_same_pairs(tiny_models: dict[str, Path]) -> None:
    """A cross-encoder tokenizes the query with every item: the query is cut up front (to about twice the maximum
    length), and the pairs are the ones the untouched query gives."""
    from transformers import AutoModelForSequenceClassification

    from sie_worker.adapters.layers.text_tokenizer import TextTokenizer

    directory = tiny_models["test/tiny-reranker"]
    tokenizer = TextTokenizer(directory, None, AutoModelForSequenceClassification.from_pretrained(directory))
    query = "how do late interaction models score documents " * 400
    # Up to twice the maximum length (128): longer ones may see the odd token of the budget on the other side.
    documents = ["short", "a somewhat longer document about retrieval " * 5, "x " * 200, "", "x " * 250]
    whole = [encoding.ids for encoding in tokenizer.rust.encode_batch([(query.lower(), document) for document in documents])]
    assert [pair.ids for pair in tokenizer.encode_pairs(query, documents)] == whole


# --- defect 15c: a Work request's timeout -----------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [2**62, 10**12], ids=["2^62 s", "1e12 s"])
def test_a_huge_work_timeout_is_answered(bounded, bounded_stub, reference, seconds, reliability_report) -> None:
    work = worker_pb2.WorkRequest(
        request_id="huge-timeout",
        timeout=duration_pb2.Duration(seconds=seconds),
        encode=inference_pb2.EncodeRequest(model=KNOWN_MODEL, items=[types_pb2.Item(text=text) for text in KNOWN]),
    )
    with grpc.insecure_channel(bounded.address) as channel:
        stream = worker_pb2_grpc.WorkerStub(channel).Work(iter([work]), timeout=DEADLINE_S)
        try:
            answer = next(stream, None)
            outcome = "answered" if answer is not None else "stream ended unanswered"
        except grpc.RpcError as error:
            answer, outcome = None, error.code().name
        reliability_report.add("adversarial bounds", f"Work timeout of {seconds} s", expected="answered", actual=outcome)
        assert answer is not None, outcome
        stream.cancel()
    assert answer.request_id == "huge-timeout" and answer.WhichOneof("outcome") == "encode"
    np.testing.assert_array_equal(stacked(result.dense for result in answer.encode.results), reference)


# --- defect 15d: extract threshold ---------------------------------------------------------------------------------


@pytest.mark.parametrize("threshold", [math.nan, math.inf, -math.inf, -0.5, 1.5])
def test_extract_threshold_must_be_a_probability(bounded_stub, reference, threshold, reliability_report) -> None:
    request = inference_pb2.ExtractRequest(model="test/tiny-ner", items=[types_pb2.Item(text="Ada Lovelace")], threshold=threshold)
    error = refused(bounded_stub.Extract, request)
    reliability_report.add("adversarial bounds", f"extract threshold {threshold}", expected="INVALID_ARGUMENT INVALID_THRESHOLD", actual=outcome(error))
    assert_refused(error, "INVALID_THRESHOLD")
    assert len(bounded_stub.Extract(inference_pb2.ExtractRequest(model="test/tiny-ner", items=[types_pb2.Item(text="Ada")], threshold=0.5), timeout=DEADLINE_S).results) == 1
    np.testing.assert_array_equal(known(bounded_stub), reference)


# --- every request field has an upper bound -------------------------------------------------------------------------


def _encode(**fields) -> inference_pb2.EncodeRequest:
    fields.setdefault("model", KNOWN_MODEL)
    fields.setdefault("items", [types_pb2.Item(text="hello")])
    return inference_pb2.EncodeRequest(**fields)


def _nested(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"deeper": value}
    return value


FIELD_CASES = {
    "items": ("Encode", _encode(items=[types_pb2.Item(text="x")] * 65), "TOO_MANY_ITEMS", "SIE_MAX_ITEMS_PER_REQUEST"),
    "text bytes": ("Encode", _encode(items=[types_pb2.Item(text="ü" * 2049)]), "TEXT_TOO_LONG", "SIE_MAX_TEXT_BYTES"),
    "score query bytes": (
        "Score",
        inference_pb2.ScoreRequest(model="test/tiny-reranker", query=types_pb2.Item(text="q" * 4097), items=[types_pb2.Item(text="x")]),
        "TEXT_TOO_LONG", "SIE_MAX_TEXT_BYTES",
    ),
    "instruction bytes": ("Encode", _encode(instruction="i" * 65), "INSTRUCTION_TOO_LONG", "SIE_MAX_INSTRUCTION_BYTES"),
    "model id": ("Encode", _encode(model="org/" + "m" * 29), "NAME_TOO_LONG", "SIE_MAX_NAME_BYTES"),
    "profile name": ("Encode", _encode(profile="p" * 33), "NAME_TOO_LONG", "SIE_MAX_NAME_BYTES"),
    "LoRA name": ("Encode", _encode(lora="l" * 33), "NAME_TOO_LONG", "SIE_MAX_NAME_BYTES"),
    "LoRA name in options": ("Encode", _encode(options=options({"lora": "l" * 33})), "NAME_TOO_LONG", "SIE_MAX_NAME_BYTES"),
    "label count": (
        "Extract",
        inference_pb2.ExtractRequest(model="test/tiny-ner", items=[types_pb2.Item(text="x")], labels=["a", "b", "c", "d", "e"]),
        "TOO_MANY_LABELS", "SIE_MAX_LABELS",
    ),
    "label length": (
        "Extract",
        inference_pb2.ExtractRequest(model="test/tiny-ner", items=[types_pb2.Item(text="x")], labels=["x" * 33]),
        "NAME_TOO_LONG", "SIE_MAX_NAME_BYTES",
    ),
    "options bytes": ("Encode", _encode(options=options({"padding": "x" * 600})), "OPTIONS_TOO_LARGE", "SIE_MAX_OPTIONS_BYTES"),
    "options depth": ("Encode", _encode(options=options(_nested(5))), "OPTIONS_TOO_LARGE", "SIE_MAX_OPTIONS_DEPTH"),
    "options depth through lists": ("Encode", _encode(options=options({"a": [[[[1]]]]})), "OPTIONS_TOO_LARGE", "SIE_MAX_OPTIONS_DEPTH"),
}


@pytest.mark.parametrize("case", FIELD_CASES, ids=list(FIELD_CASES))
def test_every_request_field_has_an_upper_bound(bounded_stub, reference, case, reliability_report) -> None:
    method, request, reason, setting = FIELD_CASES[case]
    error = refused(getattr(bounded_stub, method), request)
    reliability_report.add("adversarial bounds", f"over the bound: {case}", expected=f"INVALID_ARGUMENT {reason}", actual=outcome(error))
    assert_refused(error, reason, setting=setting)
    assert setting in error.details()
    np.testing.assert_array_equal(known(bounded_stub), reference)


def test_an_error_echoes_a_huge_item_id_cut_short(bounded_stub, reference) -> None:
    """Error messages and ErrorInfo name the item by its id: a megabyte id is cut, so the trailer stays small."""
    huge = "i" * 2**20
    error = refused(bounded_stub.Encode, _encode(items=[types_pb2.Item(text="ok"), types_pb2.Item(id=huge)]))
    assert_refused(error, "ITEM_WITHOUT_TEXT", item="1", item_id="i" * 128 + "...")
    assert len(error.details()) < 1024
    np.testing.assert_array_equal(known(bounded_stub), reference)


def test_at_the_bounds_requests_are_answered(bounded_stub) -> None:
    at_bounds = _encode(items=[types_pb2.Item(text="ü" * 2048)] * 64, instruction="i" * 64, profile="default")
    assert len(bounded_stub.Encode(at_bounds, timeout=DEADLINE_S).results) == 64
    # Options at their depth bound pass it: this model reads none of them, so they are refused as unknown, not as deep.
    assert error_info(refused(bounded_stub.Encode, _encode(options=options(_nested(4))))).reason == "UNKNOWN_OPTION"


# --- property: random options never crash, blow up or hang the worker ----------------------------------------------

EXAMPLES_PER_CALL = 24
# Peak RSS growth allowed over the whole property run.
FUZZ_RSS_BOUND_BYTES = 512 * 2**20
_strings = st.text(max_size=12, alphabet=st.characters(exclude_categories=("Cs",)))
_numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 1e18, -1e18, 2**62, 1e308, 200000, 1024, 64, 10, 11, 0.5]),
)
_values = st.recursive(
    st.none() | st.booleans() | _numbers | _strings,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_strings, children, max_size=4),
    max_leaves=12,
)
_muvera = st.dictionaries(st.sampled_from(["k_sim", "d_proj", "repetitions", "seed"]) | _strings, _values | _numbers, max_size=4)
_options = st.dictionaries(
    st.sampled_from(["muvera", "lora", "pooling", "normalize", "seed", "threshold"]) | _strings,
    _values | _muvera,
    max_size=4,
)


def _struct(values: dict) -> struct_pb2.Struct | None:
    try:
        return options(values)
    except (ValueError, TypeError):  # a value Struct cannot hold (an integer beyond a double's range is fine; others are not)
        return None


def test_random_options_never_crash_blow_up_or_hang_the_worker(bounded, bounded_stub, reference, reliability_report) -> None:
    before = peak_rss(bounded.process.pid)
    codes: dict[str, set[str]] = {}
    calls = {
        "encode (MUVERA)": lambda struct: bounded_stub.Encode(
            inference_pb2.EncodeRequest(model="test/tiny-colbert", items=[types_pb2.Item(text="late interaction")], output_types=["dense"], options=struct),
            timeout=DEADLINE_S,
        ),
        "encode": lambda struct: bounded_stub.Encode(_encode(options=struct), timeout=DEADLINE_S),
        "score": lambda struct: bounded_stub.Score(
            inference_pb2.ScoreRequest(model="test/tiny-colbert", query=types_pb2.Item(text="q"), items=[types_pb2.Item(text="d")], options=struct),
            timeout=DEADLINE_S,
        ),
        "extract": lambda struct: bounded_stub.Extract(
            inference_pb2.ExtractRequest(model="test/tiny-ner", items=[types_pb2.Item(text="Ada Lovelace")], options=struct), timeout=DEADLINE_S
        ),
    }

    def check(kind: str, values: dict) -> None:
        struct = _struct(values)
        if struct is None:
            return
        try:
            calls[kind](struct)
            code = grpc.StatusCode.OK
        except grpc.RpcError as error:
            code = error.code()
            assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED), (
                f"{kind} answered {code.name}: {error.details()}\n{values}"
            )
        codes.setdefault(kind, set()).add(code.name)

    fuzz = settings(max_examples=EXAMPLES_PER_CALL, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def examples_of(kind: str):
        def example(values: dict) -> None:
            check(kind, values)

        return example

    for kind in calls:
        fuzz(given(_options)(examples_of(kind)))()
    growth = peak_rss(bounded.process.pid) - before
    for kind, seen in codes.items():
        reliability_report.add("adversarial bounds", f"random options on {kind}", examples=EXAMPLES_PER_CALL, statuses="/".join(sorted(seen)))
    assert growth < FUZZ_RSS_BOUND_BYTES, f"peak RSS grew {growth / 2**20:.0f} MiB"
    np.testing.assert_array_equal(known(bounded_stub), reference)


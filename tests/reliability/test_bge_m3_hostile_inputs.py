"""Adversarial inputs for BGE-M3 (adapter bge_m3) and the encode / score paths it shares, against one real worker.

A tiny random replica (2-layer BERT with the MiniLM tokenizer, random sparse_linear.pt and a wide colbert_linear.pt),
plus copies of it whose head files are malformed the ways a download or a hand-made checkpoint can be. Each case
asserts the status, reason and values a caller must see: hybrid weights at the ends of the float range (their sum
overflowed to NaN scores, their products underflowed to 0), one weight under both of its names, head files that
cannot load (they were retried for ever as MODEL_LOAD_BACKOFF), multivector answers over the send limit and score
multivectors over SIE_MAX_SCORE_MULTIVECTOR_BYTES refused before the forward pass (they were computed and held first)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from google.protobuf import struct_pb2
from grpc_helpers import call_until_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_models import build_tiny_model
from worker_process import Services, WorkerProcess, inference_stub

from reliability.test_inputs_read_as_far_as_used import peak_rss

MODEL = "test/adversarial-bge-m3"
HIDDEN = 32
# A wide multivector head: each token's vector takes 4 KiB, so a few long texts pass the send limit below.
COLBERT_DIMS = 1024
MAX_LENGTH = 120
SEND_LIMIT = 2 * 1024 * 1024
SCORE_LIMIT = 64 * 1024 * 1024
TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "search engines rank documents",
    "a",
    "",
]
QUERY = "which engines rank documents"
# name -> what is wrong with the copy's head files
MALFORMED = {
    "truncated-sparse": "sparse_linear.pt",
    "empty-colbert": "colbert_linear.pt",
    "bias-shape": "colbert_linear.pt",
    "extra-key": "sparse_linear.pt",
    "zero-width-colbert": "colbert_linear.pt",
    "not-a-state-dict": "colbert_linear.pt",
}


def build_replica(directory: Path) -> Path:
    """A tiny BERT encoder directory with BGE-M3's two head files at its root."""
    build_tiny_model(directory, pooling="cls", normalize=False, include_prompt=True)
    model = directory / "raw"  # the BERT and its tokenizer, without the sentence-transformers modules
    torch.manual_seed(3)
    torch.save(torch.nn.Linear(HIDDEN, 1).state_dict(), model / "sparse_linear.pt")
    torch.save(torch.nn.Linear(HIDDEN, COLBERT_DIMS).state_dict(), model / "colbert_linear.pt")
    return model


def malform(model: Path, directory: Path, name: str) -> Path:
    shutil.copytree(model, directory)
    head = directory / MALFORMED[name]
    if name == "truncated-sparse":
        head.write_bytes(head.read_bytes()[: head.stat().st_size // 2])
    elif name == "empty-colbert":
        head.write_bytes(b"")
    elif name == "bias-shape":
        torch.save({"weight": torch.zeros(COLBERT_DIMS, HIDDEN), "bias": torch.zeros(3)}, head)
    elif name == "extra-key":
        torch.save(
            {
                "weight": torch.zeros(1, HIDDEN),
                "bias": torch.zeros(1),
                "scale": torch.ones(1),
            },
            head,
        )
    elif name == "zero-width-colbert":
        torch.save({"weight": torch.zeros(0, HIDDEN)}, head)
    else:  # a pickled module rather than its state dict: weights_only refuses to unpickle it
        torch.save(torch.nn.Linear(HIDDEN, 8), head)
    return directory


@pytest.fixture(scope="module")
def bge_m3_worker(services: Services, tmp_path_factory: pytest.TempPathFactory) -> WorkerProcess:
    root = tmp_path_factory.mktemp("adversarial-bge-m3")
    model = build_replica(root / "model")
    configs = root / "configs"
    configs.mkdir()
    body = "tasks: [encode, score]\noutput_types: [dense, sparse, multivector]\nprofiles:\n  default:\n    adapter: bge_m3\n"
    (configs / "m3.yaml").write_text(f"id: {MODEL}\npath: {model}\nmax_sequence_length: {MAX_LENGTH}\n{body}")
    for name in MALFORMED:
        (configs / f"{name}.yaml").write_text(f"id: test/{name}\npath: {malform(model, root / name, name)}\n{body}")
    env = {
        "SIE_MODELS_DIR": str(configs),
        "SIE_PRELOAD_MODELS": MODEL,
        "SIE_MAX_SEND_MESSAGE_BYTES": str(SEND_LIMIT),
        "SIE_MAX_SCORE_MULTIVECTOR_BYTES": str(SCORE_LIMIT),
    }
    return services.worker(env, name="bge-m3-worker")


@pytest.fixture(scope="module")
def bge_m3_stub(bge_m3_worker: WorkerProcess) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with inference_stub(bge_m3_worker) as stub:
        yield stub


def score(stub, options: dict, model: str = MODEL) -> list[float]:
    struct = struct_pb2.Struct()
    struct.update(options)
    request = inference_pb2.ScoreRequest(
        model=model,
        query=types_pb2.Item(text=QUERY),
        items=[types_pb2.Item(text=text) for text in TEXTS],
        options=struct,
    )
    response, _ = call_until_loaded(lambda: stub.Score(request, timeout=60))
    by_index = {entry.index: entry.score for entry in response.scores}
    return [by_index[index] for index in range(len(TEXTS))]


def forward_passes(stub) -> int:
    return stub.GetModel(inference_pb2.GetModelRequest(model=MODEL)).model.stats.forward_passes


@pytest.mark.parametrize(
    "weights",
    [
        {
            "dense": 1e308,
            "sparse": 1e308,
            "multivector": 1e308,
        },  # their sum overflows to inf
        {
            "dense": 5e-324,
            "sparse": 5e-324,
            "multivector": 5e-324,
        },  # weight x score underflows to 0
    ],
    ids=["huge", "subnormal"],
)
def test_hybrid_weights_at_the_ends_of_the_float_range_score_as_equal_weights(bge_m3_stub, weights: dict) -> None:
    """Only the ratios of the weights matter: weights of 1e308 (or 5e-324) each score as weights of 1 each."""
    equal = score(
        bge_m3_stub,
        {
            "score_mode": "hybrid",
            "score_weights": {"dense": 1, "sparse": 1, "multivector": 1},
        },
    )
    assert all(np.isfinite(equal)) and len(set(equal)) > 1
    served = score(bge_m3_stub, {"score_mode": "hybrid", "score_weights": weights})
    np.testing.assert_allclose(served, equal, atol=1e-6)


def test_a_weight_negligible_beside_another_scores_as_that_other_alone(bge_m3_stub) -> None:
    dense = score(bge_m3_stub, {"score_mode": "dense"})
    served = score(
        bge_m3_stub,
        {
            "score_mode": "hybrid",
            "score_weights": {"dense": 1e308, "sparse": 5e-324, "multivector": 0},
        },
    )
    np.testing.assert_allclose(served, dense, atol=1e-6)


def test_a_weight_given_under_both_names_of_the_multivector_output_is_invalid(bge_m3_stub) -> None:
    """`colbert` and `multivector` name one weight: given both, which one counted would hang on the order of the
    options map's keys (a client's choice, not the caller's), so neither does."""
    for weights in ({"colbert": 1, "multivector": 0}, {"multivector": 0, "colbert": 1}):
        with pytest.raises(grpc.RpcError) as raised:
            score(bge_m3_stub, {"score_mode": "hybrid", "score_weights": weights})
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(raised.value).reason == "INVALID_OPTIONS"
        assert "weigh the same output" in raised.value.details()


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_head_files_fail_to_load_for_good_naming_the_file(bge_m3_stub, name: str) -> None:
    request = inference_pb2.EncodeRequest(model=f"test/{name}", items=[types_pb2.Item(text="x")])
    with pytest.raises(grpc.RpcError) as raised:
        call_until_loaded(lambda: bge_m3_stub.Encode(request, timeout=60), timeout_s=60)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION, raised.value.details()
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert MALFORMED[name] in raised.value.details()


def test_a_multivector_answer_over_the_send_limit_is_refused_before_the_forward_pass(
    bge_m3_stub,
) -> None:
    """Each long text keeps MAX_LENGTH - 1 vectors of 4 KiB: 8 of them pass the 2 MiB limit. Known once tokenized,
    so the worker refuses before running them (and holding their vectors), not after."""
    texts = [" ".join(["documents"] * 400)] * 8
    request = inference_pb2.EncodeRequest(
        model=MODEL,
        items=[types_pb2.Item(text=text) for text in texts],
        output_types=["multivector"],
    )
    fits = inference_pb2.EncodeRequest(model=MODEL, items=[types_pb2.Item(text=texts[0])], output_types=["multivector"])
    response, _ = call_until_loaded(lambda: bge_m3_stub.Encode(fits, timeout=60))
    assert response.results[0].multivector.shape == [MAX_LENGTH - 1, COLBERT_DIMS]
    before = forward_passes(bge_m3_stub)
    with pytest.raises(grpc.RpcError) as raised:
        bge_m3_stub.Encode(request, timeout=60)
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info(raised.value).reason == "RESPONSE_TOO_LARGE"
    assert forward_passes(bge_m3_stub) == before


@pytest.mark.parametrize("mode", ["multivector", "hybrid"])
def test_a_score_whose_multivectors_pass_the_bound_is_refused_before_the_forward_pass(bge_m3_worker, bge_m3_stub, mode: str) -> None:
    """300 long items keep 119 vectors of 4 KiB each: 140 MiB held until the last is encoded (the worker's peak grew
    by 208 MiB), over the 64 MiB bound. Refused once tokenized; a score in dense mode of the same items runs."""
    items = [types_pb2.Item(text=" ".join(["documents"] * 400)) for _ in range(300)]
    options = struct_pb2.Struct()
    options.update({"score_mode": mode})
    request = inference_pb2.ScoreRequest(model=MODEL, query=types_pb2.Item(text=QUERY), items=items, options=options)
    before, peak = forward_passes(bge_m3_stub), peak_rss(bge_m3_worker.process.pid)
    with pytest.raises(grpc.RpcError) as raised:
        call_until_loaded(lambda: bge_m3_stub.Score(request, timeout=60))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(raised.value)
    assert (info.reason, info.metadata["setting"], info.metadata["limit"]) == ("SCORE_TOO_LARGE", "SIE_MAX_SCORE_MULTIVECTOR_BYTES", str(SCORE_LIMIT))
    assert forward_passes(bge_m3_stub) - before <= 1  # the query's pass at most: it is encoded beside the items
    assert peak_rss(bge_m3_worker.process.pid) - peak < SCORE_LIMIT
    options.update({"score_mode": "dense"})
    dense = bge_m3_stub.Score(inference_pb2.ScoreRequest(model=MODEL, query=types_pb2.Item(text=QUERY), items=items, options=options), timeout=60)
    assert len(dense.scores) == len(items)

"""LoRA adapters per request: PeftModel-equal outputs, loading answers, LRU eviction at the cap (2 in `batching_stub`)."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from peft import PeftModel
from transformers import AutoTokenizer, BertModel

from conftest import LORA_MODEL, LORAS
from tiny_models import PROMPTS
from grpc_helpers import call_until_loaded, error_details, items, stacked
from sie.v1 import inference_pb2

TEXTS = ["a lawyer reads the contract", "the court rules on appeal", "short"]


def reference(base: Path, lora: Path | None, texts: list[str]) -> np.ndarray:
    """Mean-pooled, normalized embeddings computed with transformers (+ a PeftModel) directly.

    The tiny models carry the document prompt "passage: ", which the worker puts before each text.
    """
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = BertModel.from_pretrained(base)
    if lora is not None:
        model = PeftModel.from_pretrained(model, lora)
    model.eval()
    batch = tokenizer([PROMPTS["document"] + text for text in texts], padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def encode(stub, lora: str = "", texts: list[str] = TEXTS, via_options: bool = False) -> inference_pb2.EncodeResponse:
    request = inference_pb2.EncodeRequest(model=LORA_MODEL, items=items(texts))
    if via_options:
        request.options.update({"lora": lora})
    else:
        request.lora = lora
    return stub.Encode(request, timeout=60)


def loaded(stub) -> list[str]:
    return list(stub.GetModel(inference_pb2.GetModelRequest(model=LORA_MODEL)).model.loaded_loras)


def test_first_use_answers_lora_loading_then_matches_peft(batching_stub, tiny_models) -> None:
    # With 3 adapters and a cap of 2, one is never loaded (whatever other tests used before).
    name = next(lora for lora in LORAS if lora not in loaded(batching_stub))
    with pytest.raises(grpc.RpcError) as raised:
        encode(batching_stub, name)
    info, retry = error_details(raised.value)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert info.reason == "LORA_LOADING" and retry is not None

    response, _ = call_until_loaded(lambda: encode(batching_stub, name))
    served = stacked(result.dense for result in response.results)
    expected = reference(tiny_models["test/tiny-mean"], tiny_models[f"lora/{name}"], TEXTS)
    np.testing.assert_allclose(served, expected, atol=1e-5)

    base = stacked(result.dense for result in encode(batching_stub).results)
    np.testing.assert_allclose(base, reference(tiny_models["test/tiny-mean"], None, TEXTS), atol=1e-5)
    assert np.abs(base - served).max() > 1e-2, "the LoRA did not change the output"

    # The reference SDK passes the adapter as options.lora: the same answer.
    aliased = stacked(result.dense for result in encode(batching_stub, name, via_options=True).results)
    np.testing.assert_allclose(aliased, served, atol=1e-6)


def test_model_lists_its_loras(batching_stub) -> None:
    model = batching_stub.GetModel(inference_pb2.GetModelRequest(model=LORA_MODEL)).model
    assert list(model.loras) == sorted(LORAS)


def test_least_recently_used_adapter_is_evicted_at_the_cap_and_reloads(batching_stub, tiny_models) -> None:
    for name in ("alpha", "beta"):
        call_until_loaded(lambda: encode(batching_stub, name))
    assert loaded(batching_stub) == ["alpha", "beta"]

    call_until_loaded(lambda: encode(batching_stub, "gamma"))
    assert loaded(batching_stub) == ["beta", "gamma"], "alpha, the least recently used, should be evicted at the cap of 2"

    response, waits = call_until_loaded(lambda: encode(batching_stub, "alpha"))
    assert waits >= 1, "alpha was evicted: its next use reloads it (LORA_LOADING first)"
    assert loaded(batching_stub) == ["gamma", "alpha"]
    expected = reference(tiny_models["test/tiny-mean"], tiny_models["lora/alpha"], TEXTS)
    np.testing.assert_allclose(stacked(result.dense for result in response.results), expected, atol=1e-5)


def test_disagreeing_lora_and_options_lora_is_invalid(batching_stub) -> None:
    request = inference_pb2.EncodeRequest(model=LORA_MODEL, items=items(TEXTS), lora="alpha")
    request.options.update({"lora": "beta"})
    with pytest.raises(grpc.RpcError) as raised:
        batching_stub.Encode(request, timeout=60)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_details(raised.value)[0].reason == "CONFLICTING_OPTIONS"
    assert "lora" in raised.value.details() and "options.lora" in raised.value.details()


@pytest.mark.parametrize("number", [float("inf"), float("nan")])
def test_options_that_are_not_plain_json_are_invalid(batching_stub, number: float) -> None:
    """Found by tests/reliability/test_fuzzing.py: a Struct number that JSON cannot hold answered INTERNAL."""
    request = inference_pb2.EncodeRequest(model=LORA_MODEL, items=items(TEXTS))
    request.options.update({"lora": number})
    with pytest.raises(grpc.RpcError) as raised:
        batching_stub.Encode(request, timeout=60)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_details(raised.value)[0].reason == "INVALID_OPTIONS"
    assert "options.lora must be a string" in raised.value.details()
    assert len(batching_stub.Encode(inference_pb2.EncodeRequest(model=LORA_MODEL, items=items(TEXTS)), timeout=60).results) == len(TEXTS)

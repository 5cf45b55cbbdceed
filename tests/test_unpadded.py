"""BERT-family encoders on real tokens only: transformers' outputs at every real position, with packed
weights, heads and LoRA adapters; models of another layout left as they were; served the same either way."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import (
    AutoModel,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    DistilBertConfig,
    DistilBertModel,
    ElectraConfig,
    ElectraModel,
    RobertaConfig,
    RobertaModel,
)

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_contract.tensors import from_tensor
from sie_worker.adapters.hf import load_model
from sie_worker.kernels.onednn import onednn_available, use_onednn
from sie_worker.kernels.unpadded import use_unpadded

# Wide weights, so attending to a padded key or skipping the mask moves outputs far past the tolerance.
CONFIG = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, initializer_range=0.5)


def built(model_class: type, config: object, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return model_class(config).eval()


def inputs(vocab_size: int = CONFIG.vocab_size) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab_size, (4, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    mask[3, 8:] = 0
    ids[mask == 0] = 1  # the pad id of the RoBERTa config below
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def run(model: torch.nn.Module, **extra: object) -> object:
    with torch.inference_mode():
        return model(**inputs(model.config.vocab_size), **extra)


def assert_real_positions_match(got: torch.Tensor, expected: torch.Tensor) -> None:
    real = inputs()["attention_mask"].bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "onednn"])
def test_bert_matches_transformers_at_every_real_position(packed: bool) -> None:
    if packed and not onednn_available():
        pytest.skip("this PyTorch build has no oneDNN")
    reference, model = built(BertModel, CONFIG), built(BertModel, CONFIG)
    if packed:
        use_onednn(model)

    assert use_unpadded(model)
    got, expected = run(model), run(reference)
    assert_real_positions_match(got.last_hidden_state, expected.last_hidden_state)
    assert got.last_hidden_state[~inputs()["attention_mask"].bool()].abs().max() == 0
    torch.testing.assert_close(got.pooler_output, expected.pooler_output, atol=1e-5, rtol=1e-5)


def test_roberta_positions_electra_and_a_classification_head_match() -> None:
    """RoBERTa numbers positions from its pad id; ELECTRA has no pooler; a head reaches the unpadded base model through `model.bert`."""
    roberta_config = RobertaConfig(**{**CONFIG.to_dict(), "pad_token_id": 1, "max_position_embeddings": 20})
    reference, model = built(RobertaModel, roberta_config), built(RobertaModel, roberta_config)
    assert use_unpadded(model)
    assert_real_positions_match(run(model).last_hidden_state, run(reference).last_hidden_state)

    electra_config = ElectraConfig(**{**CONFIG.to_dict(), "embedding_size": CONFIG.hidden_size})
    reference, model = built(ElectraModel, electra_config), built(ElectraModel, electra_config)
    assert use_unpadded(model)
    assert_real_positions_match(run(model).last_hidden_state, run(reference).last_hidden_state)

    head_config = BertConfig(**{**CONFIG.to_dict(), "num_labels": 1})
    reference_head, head = built(BertForSequenceClassification, head_config), built(BertForSequenceClassification, head_config)
    assert use_unpadded(head)
    torch.testing.assert_close(run(head).logits, run(reference_head).logits, atol=1e-5, rtol=1e-5)


def test_lora_adapters_apply_on_real_tokens(tmp_path: Path) -> None:
    adapter = get_peft_model(built(BertModel, CONFIG), LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value", "dense"], init_lora_weights=False))
    adapter.save_pretrained(tmp_path / "lora")
    reference = PeftModel.from_pretrained(built(BertModel, CONFIG), tmp_path / "lora").eval()
    base = built(BertModel, CONFIG)
    assert use_unpadded(base)
    served = PeftModel.from_pretrained(base, tmp_path / "lora").eval()

    with_lora = run(served).last_hidden_state
    assert_real_positions_match(with_lora, run(reference).last_hidden_state)
    plain = run(built(BertModel, CONFIG)).last_hidden_state
    assert (with_lora - plain).abs().max() > 1e-2  # the adapter really changed the output
    with served.disable_adapter():
        assert_real_positions_match(run(served).last_hidden_state, plain)


def test_calls_it_does_not_cover_take_the_padded_forward() -> None:
    reference, model = built(BertModel, CONFIG), built(BertModel, CONFIG)
    assert use_unpadded(model)
    got, expected = run(model, output_hidden_states=True), run(reference, output_hidden_states=True)
    assert len(got.hidden_states) == len(expected.hidden_states) == CONFIG.num_hidden_layers + 1
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state)  # pad positions too: transformers' own forward


@pytest.mark.parametrize(
    "model",
    [
        built(BertModel, BertConfig(**{**CONFIG.to_dict(), "position_embedding_type": "relative_key"})),
        built(BertModel, BertConfig(**{**CONFIG.to_dict(), "is_decoder": True})),
        built(ElectraModel, ElectraConfig(**{**CONFIG.to_dict(), "embedding_size": 16})),
        built(DistilBertModel, DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64)),
    ],
    ids=["relative-positions", "decoder", "electra-embedding-projection", "distilbert"],
)
def test_other_layouts_are_left_as_they_were(model: torch.nn.Module) -> None:
    assert not use_unpadded(model)
    assert "forward" not in vars(model.base_model)


@pytest.mark.parametrize(("reads_padding", "setting", "unpadded"), [(False, True, True), (False, False, False), (True, True, False)])
def test_load_model_unpads_only_where_the_adapter_and_the_setting_allow(tiny_models, reads_padding: bool, setting: bool, unpadded: bool) -> None:
    context = SimpleNamespace(
        weights=tiny_models["test/tiny-mean"], dtype=torch.float32, device=torch.device("cpu"), attention_backend="auto",
        profile=SimpleNamespace(trust_remote_code=False), cpu_onednn=False, cpu_unpadded=setting,
    )
    model = load_model(AutoModel, context, reads_padding=reads_padding)
    assert ("forward" in vars(model.base_model)) is unpadded


def test_a_served_model_gives_the_same_embeddings_and_scores_with_the_setting_off(stub, start_worker) -> None:
    """Through real workers: an embedder and a reranker, unpadded by default and padded with SIE_CPU_UNPADDED=false."""
    texts = ("a lawyer reads the contract before signing it", "short", "the court")
    encode = inference_pb2.EncodeRequest(model="test/tiny-mean", items=[types_pb2.Item(text=text) for text in texts])
    score = inference_pb2.ScoreRequest(model="test/tiny-reranker", query=types_pb2.Item(text="contract"), items=[types_pb2.Item(text=text) for text in texts])
    padded_worker = start_worker(SIE_CPU_UNPADDED="false", SIE_PRELOAD_MODELS="test/tiny-mean,test/tiny-reranker")
    with grpc.insecure_channel(padded_worker.address) as channel:
        padded_stub = inference_pb2_grpc.InferenceStub(channel)
        padded_vectors = [from_tensor(result.dense) for result in padded_stub.Encode(encode, timeout=60).results]
        padded_scores = [(result.index, result.score) for result in padded_stub.Score(score, timeout=60).scores]
    vectors = [from_tensor(result.dense) for result in stub.Encode(encode, timeout=60).results]
    scores = [(result.index, result.score) for result in stub.Score(score, timeout=60).scores]

    assert len(vectors) == len(texts)
    for got, expected in zip(vectors, padded_vectors):
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert [index for index, _ in scores] == [index for index, _ in padded_scores]
    np.testing.assert_allclose([value for _, value in scores], [value for _, value in padded_scores], atol=1e-5)

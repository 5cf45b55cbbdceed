"""oneDNN-packed CPU Linear layers: the same outputs as plain PyTorch, with and without LoRA adapters, counted in memory, and off with SIE_CPU_ONEDNN=false."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModel, BertConfig, BertModel

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_contract.tensors import from_tensor
from sie_worker.kernels.onednn import DenseGelu, PackedLinear, onednn_available, packed_matches, use_onednn
from sie_worker.models.memory import module_bytes

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN")

# Wide weights put pre-activations where exact and approximate GELU differ by more than the tolerance.
CONFIG = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, hidden_act="gelu", initializer_range=0.5)


def bert(seed: int = 0) -> BertModel:
    torch.manual_seed(seed)
    return BertModel(CONFIG).eval()


def inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, CONFIG.vocab_size, (3, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # a padded row
    mask[2, 2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def hidden(model: torch.nn.Module) -> torch.Tensor:
    with torch.inference_mode():
        return model(**inputs()).last_hidden_state


def test_packed_model_matches_plain_pytorch() -> None:
    plain, packed = bert(), bert()
    plain_bytes = module_bytes(SimpleNamespace(model=packed))
    linears = [module for module in packed.modules() if type(module) is torch.nn.Linear]

    assert use_onednn(packed) == len(linears) == 2 * 6 + 1  # per layer q, k, v, out, up, down; the pooler
    assert all(type(linear) is PackedLinear for linear in linears)
    assert [type(layer.intermediate) for layer in packed.encoder.layer] == [DenseGelu, DenseGelu]
    torch.testing.assert_close(hidden(packed), hidden(plain), atol=1e-5, rtol=1e-5)
    # The packed copies count in the model's memory; the state dict is unchanged.
    linear_bytes = sum(linear.weight.numel() * 4 for linear in linears)
    assert module_bytes(SimpleNamespace(model=packed)) == plain_bytes + linear_bytes
    assert packed.state_dict().keys() == plain.state_dict().keys()


def test_non_gelu_feed_forward_is_packed_but_not_fused() -> None:
    torch.manual_seed(0)
    plain = BertModel(BertConfig(**{**CONFIG.to_dict(), "hidden_act": "gelu_new"})).eval()
    packed = BertModel(plain.config).eval()
    packed.load_state_dict(plain.state_dict())

    assert use_onednn(packed) == 13
    assert not any(isinstance(module, DenseGelu) for module in packed.modules())
    torch.testing.assert_close(hidden(packed), hidden(plain), atol=1e-5, rtol=1e-5)


def test_lora_on_the_fused_up_projection_matches_peft_on_plain_pytorch(tmp_path: Path) -> None:
    """A LoRA delta on `intermediate.dense` must go in before the GELU, so the fused block unfuses under peft."""
    adapter = get_peft_model(bert(), LoraConfig(r=4, lora_alpha=8, target_modules=["dense", "query"], init_lora_weights=False))
    adapter.save_pretrained(tmp_path / "lora")

    reference = PeftModel.from_pretrained(bert(), tmp_path / "lora").eval()
    packed_base = bert()
    use_onednn(packed_base)
    served = PeftModel.from_pretrained(packed_base, tmp_path / "lora").eval()

    with_lora = hidden(served)
    torch.testing.assert_close(with_lora, hidden(reference), atol=1e-5, rtol=1e-5)
    assert (with_lora - hidden(bert())).abs().max() > 1e-2  # the adapter really changed the output
    with served.disable_adapter():
        torch.testing.assert_close(hidden(served), hidden(bert()), atol=1e-5, rtol=1e-5)


def test_the_load_time_check_tells_a_right_packing_from_a_wrong_one() -> None:
    first, second = bert().encoder.layer[0].attention.self.query, bert(seed=1).encoder.layer[0].attention.self.query
    assert packed_matches(first, torch.ops.mkldnn._reorder_linear_weight(first.weight.detach()))
    assert not packed_matches(first, torch.ops.mkldnn._reorder_linear_weight(second.weight.detach()))


def test_a_served_model_is_packed_by_default_and_plain_with_the_setting_off(stub, start_worker, tiny_models) -> None:
    """Through real workers: the same embeddings either way; the default worker holds the packed copies in memory."""
    model = "test/tiny-mean"
    plain_worker = start_worker(SIE_CPU_ONEDNN="false", SIE_PRELOAD_MODELS=model)
    request = inference_pb2.EncodeRequest(model=model, items=[types_pb2.Item(text=text) for text in ("a lawyer reads the contract", "short")])
    with grpc.insecure_channel(plain_worker.address) as channel:
        plain_stub = inference_pb2_grpc.InferenceStub(channel)
        plain = [from_tensor(result.dense) for result in plain_stub.Encode(request, timeout=60).results]
        plain_bytes = plain_stub.GetModel(inference_pb2.GetModelRequest(model=model)).model.memory_bytes
    packed = [from_tensor(result.dense) for result in stub.Encode(request, timeout=60).results]
    packed_bytes = stub.GetModel(inference_pb2.GetModelRequest(model=model)).model.memory_bytes

    for a, b in zip(packed, plain):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # the served model has no pooler (its pooling never reads it: sentence_transformer drops it)
    reference = AutoModel.from_pretrained(tiny_models[model], add_pooling_layer=False)
    linear_bytes = sum(module.weight.numel() * 4 for module in reference.modules() if type(module) is torch.nn.Linear)
    # and each layer's query, key and value packed side by side, biases too (sie_worker.kernels.unpadded)
    attention = [layer.attention.self for layer in reference.encoder.layer]
    fused_bytes = sum((p.weight.numel() + p.bias.numel()) * 4 for a in attention for p in (a.query, a.key, a.value))
    assert packed_bytes - plain_bytes == linear_bytes + fused_bytes > 0

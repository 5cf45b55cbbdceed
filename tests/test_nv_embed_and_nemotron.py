"""NVIDIA's decoder embedders served natively, with no code shipped with the weights run.

Tiny random replicas in each checkpoint's own layout (tools/tiny_nvidia_embedders.py), served by one worker:
- nvidia/NV-Embed-v2 on the `nv_embed` adapter (a bidirectional Mistral, latent-attention pooling, the prompt left
  out of pooling, the EOS appended);
- nvidia/llama-embed-nemotron-8b on the `sentence_transformer` adapter (its `llama_bidirec` model type loaded as
  transformers' LlamaModel, bidirectional; mean pooling, normalized).

Two oracles:
- always: each model's documented math written out below with plain torch ops over the replica's own weights
  (`_decoder_states`, `_latent_attention_pool`), one text at a time (padding adds nothing a token attends to);
- when the checkpoint's shipped code is on this machine: that code, run in-process with trust_remote_code
  (NV-Embed-v2's `encode`; llama-embed-nemotron-8b's model as its model card runs it). The repository holds no copy
  of it (it is not ours; NV-Embed-v2's is licensed CC-BY-NC-4.0): the tests read it from the Hugging Face cache
  (`huggingface_hub.try_to_load_from_cache`, after e.g. `hf download nvidia/NV-Embed-v2 modeling_nvembed.py
  configuration_nvembed.py` and `hf download nvidia/llama-embed-nemotron-8b llama_bidirectional_model.py`) or
  from the folder SIE_TEST_SHIPPED_CODE_DIR names, laid out `<folder>/<org>__<name>/<file>`
  (`<folder>/nvidia__NV-Embed-v2/modeling_nvembed.py`, ...), and skip without it. NV-Embed-v2's code imports
  einops and datasets (the test extra has both). The edits that make it run on transformers 5 are `_NV_EMBED_EDITS`
  (each asserted to apply once; none changes what is computed).

The worker serves copies of the replicas whose shipped code is a tripwire (it records that it ran, then fails), so
an answer at all shows that no shipped code ran; a profile that trusts the code runs it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from huggingface_hub import try_to_load_from_cache
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoTokenizer
from transformers.dynamic_module_utils import get_class_from_dynamic_module

from grpc_helpers import error_info
from sie.v1 import inference_pb2_grpc
from test_decoder_embedders import TEXTS, cosines, encode
from tiny_decoders import DECODER_MAX_LENGTH
from tiny_models import write_config
from tiny_nvidia_embedders import build_llama_embed_nemotron, build_nv_embed
from worker_process import Services, inference_stub

QUERY_PROMPT = "Instruct: Given a question, retrieve passages that answer the question\nQuery: "
INSTRUCTION_TEMPLATE = "Instruct: {instruction}\nQuery: "
INSTRUCTION = "Given a claim, find documents that refute it"

NV_EMBED = "test/nv-embed"
NV_BAD_LATENTS = "test/nv-embed-bad-latents"
NV_CAUSAL_DECODER = "test/nv-embed-causal-decoder"
NV_OTHER_PREFIX = "test/nv-embed-other-prefix"
NV_LIST_CONFIG = "test/nv-embed-list-config"
NEMOTRON = "test/llama-embed-nemotron"
# The replica with its real shipped code (when supplied), served by a profile that trusts it.
NEMOTRON_TRUSTED = "test/llama-embed-nemotron-trusted"
TRIPWIRE = "tripwire.txt"

# Where the checkpoints' shipped code is read from (besides the Hugging Face cache), and its files.
SHIPPED_CODE_DIR_ENV = "SIE_TEST_SHIPPED_CODE_DIR"
NV_EMBED_REPO = "nvidia/NV-Embed-v2"
NEMOTRON_REPO = "nvidia/llama-embed-nemotron-8b"
SHIPPED_CODE_FILES = {
    NV_EMBED_REPO: ("modeling_nvembed.py", "configuration_nvembed.py"),
    NEMOTRON_REPO: ("llama_bidirectional_model.py",),
}

# Edits that make NV-Embed-v2's shipped code (written for transformers 4.42) run on transformers 5; none touches
# what it computes. (file, as shipped, as run)
_NV_EMBED_EDITS = (
    # transformers 5 no longer has Mistral's forward docstring, which the code imports to decorate its forward.
    (
        "modeling_nvembed.py",
        "from transformers.models.mistral.modeling_mistral import MISTRAL_INPUTS_DOCSTRING\n",
        "",
    ),
    ("modeling_nvembed.py", "    @add_start_docstrings_to_model_forward(MISTRAL_INPUTS_DOCSTRING)\n", ""),
    # transformers 5's configs set internal attributes in PretrainedConfig.__init__, which this one never called.
    (
        "configuration_nvembed.py",
        "        self.cross_dim_head = cross_dim_head\n",
        "        self.cross_dim_head = cross_dim_head\n        super().__init__(**kwargs)\n",
    ),
    # transformers 5 computes the rotary embeddings once per model and hands them to each decoder layer ...
    (
        "modeling_nvembed.py",
        "        for decoder_layer in self.layers:\n            if output_hidden_states:",
        "        position_embeddings = self.rotary_emb(hidden_states, position_ids)\n"
        "        for decoder_layer in self.layers:\n            if output_hidden_states:",
    ),
    # ... whose output is the hidden states (a tensor), not a tuple of them.
    (
        "modeling_nvembed.py",
        "                    use_cache=use_cache,\n                )\n\n            hidden_states = layer_outputs[0]",
        "                    use_cache=use_cache,\n                    position_embeddings=position_embeddings,\n"
        "                )\n\n            hidden_states = layer_outputs",
    ),
)


def _shipped_code(repo_id: str) -> dict[str, Path] | None:
    """The checkpoint's shipped code files by name, from SIE_TEST_SHIPPED_CODE_DIR/<org>__<name>/ or else the
    Hugging Face cache; None when neither holds every one."""
    names = SHIPPED_CODE_FILES[repo_id]
    folder = os.environ.get(SHIPPED_CODE_DIR_ENV)
    if folder:
        supplied = {name: Path(folder) / repo_id.replace("/", "__") / name for name in names}
        if all(path.is_file() for path in supplied.values()):
            return supplied
    cached = {name: try_to_load_from_cache(repo_id, name) for name in names}
    if all(isinstance(path, str) for path in cached.values()):
        return {name: Path(str(path)) for name, path in cached.items()}
    return None


def _require_shipped_code(repo_id: str) -> None:
    """Skip the test, saying how to supply the code, when this machine lacks it."""
    if _shipped_code(repo_id) is None:
        names = " ".join(SHIPPED_CODE_FILES[repo_id])
        pytest.skip(
            f"{repo_id}'s shipped code ({names}) is neither in the Hugging Face cache nor under "
            f"${SHIPPED_CODE_DIR_ENV}/{repo_id.replace('/', '__')}/: download it (hf download {repo_id} {names}) "
            f"or set {SHIPPED_CODE_DIR_ENV} to a folder holding it"
        )


def _yaml(path: Path, adapter: str, extra: str = "") -> str:
    return (
        f"path: {path}\ntasks: [encode]\noutput_types: [dense]\nprofiles:\n  default:\n    adapter: {adapter}\n"
        f"    run_options:\n      query_prompt: {json.dumps(QUERY_PROMPT)}\n      document_prompt: ''\n"
        f"      instruction_prompt: {json.dumps(INSTRUCTION_TEMPLATE)}\n{extra}"
    )


def _install_code(directory: Path, repo_id: str, edits: tuple[tuple[str, str, str], ...] = ()) -> None:
    """The checkpoint's shipped code (where this machine has it) into the model directory, edited."""
    files = _shipped_code(repo_id)
    for name, path in (files or {}).items():
        code = path.read_text()
        for edited, shipped, run in edits:
            if edited == name:
                assert code.count(shipped) == 1, f"{name}: the edit no longer applies"
                code = code.replace(shipped, run)
        (directory / name).write_text(code)


def _tripwire_copy(directory: Path, copy: Path, code_files: list[str]) -> Path:
    """`directory` with each shipped code file replaced by one that records it ran and fails."""
    shutil.copytree(directory, copy)
    for name in code_files:
        (copy / name).write_text(
            f"import pathlib\npathlib.Path({str(copy / TRIPWIRE)!r}).write_text('ran')\n"
            "raise ValueError('the shipped code ran')\n"
        )
    return copy


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The replicas (llama-embed-nemotron's with its shipped code where this machine has it, for the profile that
    trusts it) and the tripwire copies the worker serves, by model id."""
    root = tmp_path_factory.mktemp("nvidia-embedders")
    nv_embed = build_nv_embed(root / "nv-embed")
    nemotron = build_llama_embed_nemotron(root / "nemotron", query_prompt=QUERY_PROMPT, seed=1)
    _install_code(nemotron, NEMOTRON_REPO)
    served_nv = _tripwire_copy(nv_embed, root / "nv-embed-served", ["modeling_nvembed.py", "configuration_nvembed.py"])
    bad_latents = shutil.copytree(served_nv, root / "nv-embed-bad-latents")
    causal = shutil.copytree(served_nv, root / "nv-embed-causal")
    for copy, change in ((bad_latents, {"num_latents_value": 8}), (causal, {"model_type": "mistral"})):
        config = json.loads((copy / "config.json").read_text())
        section = "latent_attention_config" if "num_latents_value" in change else "text_config"
        config[section].update(change)
        (copy / "config.json").write_text(json.dumps(config))
    # The decoder's weights under another prefix: none of MistralModel's would load (never random ones instead).
    other_prefix = shutil.copytree(served_nv, root / "nv-embed-other-prefix")
    shard = other_prefix / "model-00001-of-00002.safetensors"
    save_file(
        {key.replace("embedding_model.", "text_model."): value for key, value in load_file(str(shard)).items()},
        str(shard),
    )
    index = other_prefix / "model.safetensors.index.json"
    index.write_text(index.read_text().replace('"embedding_model.', '"text_model.'))
    list_config = shutil.copytree(served_nv, root / "nv-embed-list-config")
    (list_config / "config.json").write_text("[]")
    return {
        "nv_embed_reference": nv_embed,
        "nemotron_reference": nemotron,
        NV_EMBED: served_nv,
        NV_BAD_LATENTS: bad_latents,
        NV_CAUSAL_DECODER: causal,
        NV_OTHER_PREFIX: other_prefix,
        NV_LIST_CONFIG: list_config,
        NEMOTRON: _tripwire_copy(nemotron, root / "nemotron-served", ["llama_bidirectional_model.py"]),
    }


@pytest.fixture(scope="module")
def stub(
    services: Services, replicas: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[inference_pb2_grpc.InferenceStub]:
    configs = tmp_path_factory.mktemp("nvidia-configs")
    for model_id in (NV_EMBED, NV_BAD_LATENTS, NV_CAUSAL_DECODER, NV_OTHER_PREFIX, NV_LIST_CONFIG):
        write_config(configs, model_id, _yaml(replicas[model_id], "nv_embed"))
    profiles = (
        "  causal:\n    extends: default\n    load_options: {bidirectional: false}\n"
        "  trusted:\n    extends: default\n    load_options: {trust_remote_code: true}\n"
    )
    write_config(configs, NEMOTRON, _yaml(replicas[NEMOTRON], "sentence_transformer", profiles))
    trusted = "    load_options: {trust_remote_code: true}\n"
    write_config(configs, NEMOTRON_TRUSTED, _yaml(replicas["nemotron_reference"], "sentence_transformer") + trusted)
    worker = services.worker(
        {"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": f"{NV_EMBED},{NEMOTRON}"}, name="nvidia-worker"
    )
    with inference_stub(worker) as inference:
        yield inference


def _prompt(fields: dict[str, Any]) -> str:
    if "instruction" in fields:
        return INSTRUCTION_TEMPLATE.replace("{instruction}", fields["instruction"])
    return QUERY_PROMPT if fields.get("is_query") else ""


CASES = [{"is_query": True}, {}, {"instruction": INSTRUCTION, "is_query": True}]
CASE_IDS = ["query", "document", "instruction"]


def _assert_serves(stub, model_id: str, fields: dict[str, Any], expected: np.ndarray) -> np.ndarray:
    """The model's served vectors for TEXTS with the request's `fields`, asserted to point where `expected`'s do
    (cosine >= 0.9999 for each text)."""
    served = encode(stub, model_id, **fields)
    assert served.shape == expected.shape == (len(TEXTS), 32)
    assert cosines(served, expected).min() >= 0.9999
    return served


# --- The documented math, written out (the oracle that needs no shipped code) -----------------------------------


def _checkpoint_weights(directory: Path, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of the directory's safetensors files whose key starts with `prefix`, by the key without it."""
    return {
        key.removeprefix(prefix): value
        for shard in sorted(directory.glob("*.safetensors"))
        for key, value in load_file(str(shard)).items()
        if key.startswith(prefix)
    }


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def _rotate(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary positions on [heads, tokens, width]: pair i of the halves (i, i + width/2) at position p turned by
    p * theta^(-2i/width), positions counted from 0."""
    half = x.shape[-1] // 2
    frequencies = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    angles = torch.arange(x.shape[1], dtype=torch.float64)[:, None] * frequencies[None, :]
    cos, sin = angles.cos(), angles.sin()
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def _decoder_states(
    weights: dict[str, torch.Tensor], config: dict[str, Any], ids: list[int], *, causal: bool = False
) -> torch.Tensor:
    """A Llama/Mistral decoder's last hidden states [tokens, hidden] for one unpadded text, in float64: pre-norm
    (RMSNorm) blocks of grouped-query self-attention with rotary positions and a SiLU-gated MLP, a final RMSNorm.
    Each token attends to every token (causal: to those up to itself only)."""
    assert not any(key.endswith(".bias") for key in weights), "the decoder has biases this oracle leaves out"
    rope = config.get("rope_parameters") or {"rope_theta": config["rope_theta"]}
    assert rope.get("rope_type", "default") == "default", "the oracle writes out the default rotary embedding only"
    heads, kv_heads, eps = config["num_attention_heads"], config["num_key_value_heads"], config["rms_norm_eps"]
    width = config.get("head_dim") or config["hidden_size"] // heads
    w = {key: value.double() for key, value in weights.items()}
    x = w["embed_tokens.weight"][torch.tensor(ids)]
    tokens = len(ids)
    for layer in range(config["num_hidden_layers"]):
        p = f"layers.{layer}."
        h = _rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q, k, v = (
            (h @ w[f"{p}self_attn.{name}_proj.weight"].T).reshape(tokens, -1, width).transpose(0, 1) for name in "qkv"
        )
        q, k = _rotate(q, rope["rope_theta"]), _rotate(k, rope["rope_theta"])
        # Query head i reads key/value head i // (heads / kv_heads).
        k, v = (t.repeat_interleave(heads // kv_heads, dim=0) for t in (k, v))
        scores = q @ k.transpose(1, 2) / width**0.5
        if causal:
            scores = scores.masked_fill(~torch.ones(tokens, tokens, dtype=torch.bool).tril(), float("-inf"))
        attended = (scores.softmax(dim=-1) @ v).transpose(0, 1).reshape(tokens, -1)
        x = x + attended @ w[p + "self_attn.o_proj.weight"].T
        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gated = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
        x = x + gated @ w[p + "mlp.down_proj.weight"].T
    return _rms_norm(x, w["norm.weight"], eps)


def _latent_attention_pool(
    weights: dict[str, torch.Tensor], config: dict[str, Any], states: torch.Tensor, pooled: torch.Tensor
) -> torch.Tensor:
    """NV-Embed's pooling of one text's states [tokens, hidden] (float64): each token (LayerNorm, then the query
    projection) attends over the trained latents (LayerNorm, then the key/value projection, keys its first half),
    per head; the heads' outputs projected back and added to the token; then LayerNorm, a Linear whose output's
    first half is multiplied by GELU of its second, a Linear, added again; averaged over the `pooled` positions
    (a bool mask) and L2-normalized."""
    w = {key: value.double() for key, value in weights.items()}
    heads, width = config["num_cross_heads"], config["cross_dim_head"]

    def layer_norm(x: torch.Tensor, name: str) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, x.shape[-1:], w[name + ".weight"], w[name + ".bias"])

    def by_head(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], heads, width).transpose(0, 1)

    q = layer_norm(states, "cross_attend_blocks.0.norm") @ w["cross_attend_blocks.0.fn.to_q.weight"].T
    latents = layer_norm(w["latents"], "cross_attend_blocks.0.norm_context")
    k, v = (latents @ w["cross_attend_blocks.0.fn.to_kv.weight"].T).chunk(2, dim=-1)
    attended = ((by_head(q) @ by_head(k).transpose(1, 2) / width**0.5).softmax(dim=-1) @ by_head(v)).transpose(0, 1)
    x = states + attended.reshape(states.shape[0], -1) @ w["cross_attend_blocks.0.fn.to_out.weight"].T
    h = layer_norm(x, "cross_attend_blocks.1.norm") @ w["cross_attend_blocks.1.fn.net.0.weight"].T
    value, gate = (h + w["cross_attend_blocks.1.fn.net.0.bias"]).chunk(2, dim=-1)
    x = x + (value * torch.nn.functional.gelu(gate)) @ w["cross_attend_blocks.1.fn.net.2.weight"].T
    x = x + w["cross_attend_blocks.1.fn.net.2.bias"]
    mean = x[pooled].mean(dim=0)
    return torch.nn.functional.normalize(mean, dim=-1) if config["output_normalize"] else mean


def _nv_embed_oracle(directory: Path, prompt: str, *, masked: int | None = None, causal: bool = False) -> np.ndarray:
    """NV-Embed's vectors for TEXTS: each text is prompt + text + EOS, tokenized with the BOS and truncated at the
    model's length; the first `masked` positions are left out of pooling (by default, as the checkpoint's encode
    does with is_mask_instruction: as many as the prompt has tokens without the BOS, counted from position 0)."""
    config = json.loads((directory / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(directory)
    if masked is None:
        masked = len(tokenizer.tokenize(prompt)) if prompt and config["is_mask_instruction"] else 0
    decoder = _checkpoint_weights(directory, "embedding_model.")
    pooling = _checkpoint_weights(directory, "latent_attention_model.")
    rows = []
    for text in TEXTS:
        ids = tokenizer(prompt + text + tokenizer.eos_token, max_length=DECODER_MAX_LENGTH, truncation=True)
        states = _decoder_states(decoder, config["text_config"], ids["input_ids"], causal=causal)
        pooled = torch.arange(len(states)) >= masked
        rows.append(_latent_attention_pool(pooling, config["latent_attention_config"], states, pooled))
    return torch.stack(rows).numpy()


def _nemotron_oracle(directory: Path, prompt: str, *, causal: bool = False, skipped: int = 0) -> np.ndarray:
    """llama-embed-nemotron's vectors for TEXTS: prompt + text tokenized with the BOS and truncated at the model's
    length, the bidirectional Llama's last states averaged over every token (the prompt's included; `skipped`
    leaves out that many first positions) and L2-normalized."""
    config = json.loads((directory / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(directory)
    weights = _checkpoint_weights(directory)
    rows = []
    for text in TEXTS:
        ids = tokenizer(prompt + text, max_length=DECODER_MAX_LENGTH, truncation=True)["input_ids"]
        states = _decoder_states(weights, config, ids, causal=causal)
        rows.append(torch.nn.functional.normalize(states[skipped:].mean(dim=0), dim=-1))
    return torch.stack(rows).numpy()


# --- NV-Embed-v2 -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nv_embed_reference(replicas: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The checkpoint's NVEmbedModel, built by its own code (edited, in a copy of the replica: an edit that no longer
    applies fails these tests only) from the replica's config, with the replica's weights."""
    _require_shipped_code(NV_EMBED_REPO)
    directory = shutil.copytree(replicas["nv_embed_reference"], tmp_path_factory.mktemp("nv-embed-shipped") / "model")
    _install_code(directory, NV_EMBED_REPO, _NV_EMBED_EDITS)
    model_class = get_class_from_dynamic_module("modeling_nvembed.NVEmbedModel", directory)
    model = model_class(model_class.config_class.from_pretrained(directory))
    model.load_state_dict(_checkpoint_weights(directory), strict=True)
    return model.eval()


@pytest.mark.parametrize("fields", CASES, ids=CASE_IDS)
def test_nv_embed_matches_its_shipped_code(stub, nv_embed_reference, fields: dict[str, Any]) -> None:
    with torch.no_grad():
        expected = nv_embed_reference.encode(TEXTS, instruction=_prompt(fields), max_length=DECODER_MAX_LENGTH).numpy()
    _assert_serves(stub, NV_EMBED, fields, expected)


@pytest.mark.parametrize("fields", CASES, ids=CASE_IDS)
def test_nv_embed_matches_the_documented_math(stub, replicas: dict[str, Path], fields: dict[str, Any]) -> None:
    expected = _nv_embed_oracle(replicas["nv_embed_reference"], _prompt(fields))
    served = _assert_serves(stub, NV_EMBED, fields, expected)
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize(
    "change",
    [{"masked": 1}, {"masked": -1}, {"causal": True}],
    ids=["one-prompt-token-more-masked", "one-prompt-token-fewer-masked", "causal-decoder"],
)
def test_nv_embed_oracle_tells_a_near_miss_apart(stub, replicas: dict[str, Path], change: dict[str, Any]) -> None:
    """The comparison above can fail: the oracle changed by one pooled position, or run causally, is below it."""
    directory = replicas["nv_embed_reference"]
    masked = len(AutoTokenizer.from_pretrained(directory).tokenize(QUERY_PROMPT)) + change.get("masked", 0)
    near_miss = _nv_embed_oracle(directory, QUERY_PROMPT, masked=masked, causal=change.get("causal", False))
    assert cosines(encode(stub, NV_EMBED, is_query=True), near_miss).min() < 0.9999


def test_nv_embed_leaves_the_prompt_out_of_pooling(stub, replicas: dict[str, Path]) -> None:
    """A query's prompt conditions the text's tokens but is not averaged with them: the vector differs from the
    oracle's with every token pooled, and from a document's."""
    pooled_whole = _nv_embed_oracle(replicas["nv_embed_reference"], QUERY_PROMPT, masked=0)
    served = encode(stub, NV_EMBED, is_query=True)
    assert cosines(served, pooled_whole).max() < 0.999
    assert cosines(served, encode(stub, NV_EMBED)).max() < 0.999


def test_nv_embed_refuses_a_prompt_that_leaves_nothing_to_pool(stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        encode(stub, NV_EMBED, ["x"], instruction=" ".join(["long"] * 200), is_query=True)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "PROMPT_TOO_LONG"


@pytest.mark.parametrize(
    ("model_id", "message"),
    [
        (NV_BAD_LATENTS, "latent attention weight latents is (16, 32), the config makes it (8, 32)"),
        (NV_CAUSAL_DECODER, "text_config.model_type must be bidir_mistral"),
        (NV_OTHER_PREFIX, "the checkpoint lacks 20 weights of MistralModel"),
        (NV_LIST_CONFIG, "config.json: not a JSON object"),
        (NEMOTRON, "load option bidirectional: false, but model type 'llama_bidirec' attends both ways"),
    ],
)
def test_layouts_the_worker_cannot_serve_as_shipped_fail_the_load(stub, model_id: str, message: str) -> None:
    profile = "causal" if model_id == NEMOTRON else ""
    with pytest.raises(grpc.RpcError) as raised:
        encode(stub, model_id, ["x"], profile=profile)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert message in raised.value.details()


# --- llama-embed-nemotron-8b -------------------------------------------------------------------------------------


def _nemotron_reference(directory: Path, prompt: str, *, shipped_mask: bool) -> np.ndarray:
    """The model card's run: the shipped LlamaBidirectionalModel (eager attention), left padding, mean pooling over
    the attention mask, normalized. shipped_mask: the mask its `_update_causal_mask` builds (every token sees
    every real token), as transformers 4.51 used it; transformers 5 never calls that method, so without it the
    shipped code runs on the plain padding mask, causally."""
    _require_shipped_code(NEMOTRON_REPO)
    tokenizer = AutoTokenizer.from_pretrained(directory, padding_side="left")
    model = AutoModel.from_pretrained(directory, trust_remote_code=True, attn_implementation="eager").eval()
    batch = tokenizer(
        [prompt + text for text in TEXTS],
        max_length=DECODER_MAX_LENGTH,
        padding=True,
        truncation=True,
        return_tensors="pt",
    )
    mask = batch["attention_mask"]
    with torch.no_grad():
        attention = (
            model._update_causal_mask(mask, model.embed_tokens(batch["input_ids"]), None, None, False)
            if shipped_mask
            else mask
        )
        hidden = model(input_ids=batch["input_ids"], attention_mask=attention).last_hidden_state
    pooled = hidden.masked_fill(~mask[..., None].bool(), 0.0).sum(dim=1) / mask.sum(dim=1)[..., None]
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


@pytest.mark.parametrize("fields", CASES, ids=CASE_IDS)
def test_nemotron_matches_the_documented_math(stub, replicas: dict[str, Path], fields: dict[str, Any]) -> None:
    expected = _nemotron_oracle(replicas["nemotron_reference"], _prompt(fields))
    _assert_serves(stub, NEMOTRON, fields, expected)


@pytest.mark.parametrize(
    "change", [{"skipped": 1}, {"causal": True}], ids=["bos-left-out-of-pooling", "causal-decoder"]
)
def test_nemotron_oracle_tells_a_near_miss_apart(stub, replicas: dict[str, Path], change: dict[str, Any]) -> None:
    """The comparison above can fail: the oracle with its first token left out of the mean, or run causally
    (what the shipped code does on this transformers), is below it."""
    near_miss = _nemotron_oracle(replicas["nemotron_reference"], QUERY_PROMPT, **change)
    assert cosines(encode(stub, NEMOTRON, is_query=True), near_miss).min() < 0.9999


@pytest.mark.parametrize("fields", CASES, ids=CASE_IDS)
def test_nemotron_matches_its_shipped_code(stub, replicas: dict[str, Path], fields: dict[str, Any]) -> None:
    expected = _nemotron_reference(replicas["nemotron_reference"], _prompt(fields), shipped_mask=True)
    _assert_serves(stub, NEMOTRON, fields, expected)


def test_nemotron_shipped_code_on_this_transformers_runs_causally(stub, replicas: dict[str, Path]) -> None:
    """Why it is served natively: loaded with trust_remote_code on transformers 5, the shipped model gets the
    causal mask (its override is dead code), and its vectors are not the model's."""
    as_shipped = _nemotron_reference(replicas["nemotron_reference"], QUERY_PROMPT, shipped_mask=False)
    assert cosines(encode(stub, NEMOTRON, is_query=True), as_shipped).min() < 0.99


def test_no_shipped_code_ran_unless_the_profile_trusts_it(stub, replicas: dict[str, Path]) -> None:
    """Both served models answered above from directories whose shipped code is a tripwire; the profile that sets
    trust_remote_code runs it (and fails the load with its error)."""
    encode(stub, NV_EMBED, ["x"])
    encode(stub, NEMOTRON, ["x"])
    assert not (replicas[NV_EMBED] / TRIPWIRE).exists()
    assert not (replicas[NEMOTRON] / TRIPWIRE).exists()
    with pytest.raises(grpc.RpcError) as raised:
        encode(stub, NEMOTRON, ["x"], profile="trusted")
    assert "the shipped code ran" in raised.value.details()
    assert (replicas[NEMOTRON] / TRIPWIRE).read_text() == "ran"


def test_nemotron_shipped_code_when_trusted_is_still_made_bidirectional(stub, replicas: dict[str, Path]) -> None:
    """An operator who trusts the shipped code gets it run, with the causal mask switched off as its model type
    says (its own override is never called): the model's vectors, not the causal ones."""
    expected = _nemotron_reference(replicas["nemotron_reference"], QUERY_PROMPT, shipped_mask=True)
    served = encode(stub, NEMOTRON_TRUSTED, is_query=True)
    assert cosines(served, expected).min() >= 0.9999

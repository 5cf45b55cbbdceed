"""Visual document retrieval (ColPali, ColQwen2) through a real worker against ColPaliForRetrieval /
ColQwen2ForRetrieval and their processors run in-process, on tiny random replicas built offline: the same vectors
(cosine >= 0.9999 each, the same rows: padding dropped) for text queries and page images, MaxSim scores of a query
against pages equal to the processor's score_retrieval, MUVERA dense of an image, and the bounds: ColQwen2 images
yield as many vectors as their size has patches, counted before the forward pass."""

from __future__ import annotations

import functools
import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoProcessor, ColPaliForRetrieval, ColQwen2ForRetrieval

from grpc_helpers import call_until_loaded, error_info, forward_passes
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_common.cluster.model_config import load_model_config
from sie_contract.tensors import from_tensor
from sie_worker.adapters.contract import Input, LoadContext, Query
from sie_worker.adapters.families.colpali import PageRetriever
from sie_worker.engine.postprocess import MuveraParams, muvera
from tiny_colpali import EMBEDDING_DIM, build_tiny_colpali, build_tiny_colqwen2
from tiny_models import write_config
from worker_process import Services, WorkerProcess

COLPALI = "test/tiny-colpali"
COLQWEN2 = "test/tiny-colqwen2"
BUILDERS = {COLPALI: build_tiny_colpali, COLQWEN2: build_tiny_colqwen2}
REFERENCES = {COLPALI: ColPaliForRetrieval, COLQWEN2: ColQwen2ForRetrieval}
MUVERA = {"k_sim": 2, "d_proj": 4, "repetitions": 3, "seed": 5}
MUVERA_DIMS = 2**2 * 4 * 3
BODY = (
    "inputs: [text, image]\ntasks: [encode, score]\noutput_types: [multivector, dense]\nprofiles:\n  default:\n"
    f"    adapter: colpali\n    run_options:\n      muvera: {MUVERA}\n"
)
# Each ColQwen2 image holds at most 6 merged patches plus its prompt: 40 of them are more than this to hold.
MAX_MULTIVECTOR_BYTES = 32 * 1024
QUERIES = ["what is the revenue of the company?", "a chart of sales", "title"]


def picture(seed: int, size: tuple[int, int]) -> Image.Image:
    """A random picture of `size` (width, height): gradients plus noise."""
    rng = np.random.default_rng(seed)
    width, height = size
    ramp = np.linspace(0, 255, width)[None, :, None] * rng.random(3) + np.linspace(0, 255, height)[:, None, None] * rng.random(3)
    return Image.fromarray(np.clip(ramp / 2 + rng.integers(0, 60, (height, width, 3)), 0, 255).astype(np.uint8))


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


# Three pages of different sizes: ColQwen2 makes 2x2, 2x3 (rounded from 60x100) and 1x3 patch grids of them.
PAGES = [png(picture(1, (56, 56))), png(picture(2, (60, 100))), png(picture(3, (30, 80)))]


@pytest.fixture(scope="module")
def directories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("colpali")
    return {model_id: build(root / model_id.split("/")[1]) for model_id, build in BUILDERS.items()}


@pytest.fixture(scope="module")
def colpali_worker(services: Services, directories: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> WorkerProcess:
    configs = tmp_path_factory.mktemp("colpali-configs")
    for model_id, directory in directories.items():
        write_config(configs, model_id, f"path: {directory}\n{BODY}")
    return services.worker(
        {
            "SIE_MODELS_DIR": str(configs),
            "SIE_PRELOAD_MODELS": "",
            "SIE_MAX_SCORE_MULTIVECTOR_BYTES": str(MAX_MULTIVECTOR_BYTES),
        },
        name="colpali-worker",
    )


@pytest.fixture(scope="module")
def colpali_stub(colpali_worker: WorkerProcess) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with grpc.insecure_channel(colpali_worker.address) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


@functools.cache
def loaded(model_id: str, directory: Path) -> tuple[Any, Any]:
    return AutoProcessor.from_pretrained(directory, backend="pil"), REFERENCES[model_id].from_pretrained(directory).eval()


def reference(model_id: str, directory: Path, *, texts: list[str] | None = None, images: list[bytes] | None = None) -> list[torch.Tensor]:
    """Each item's vectors from the model and its processor in one batch, the rows its attention mask drops removed."""
    processor, model = loaded(model_id, directory)
    if texts is not None:
        inputs = processor.process_queries(texts)
    else:
        inputs = processor.process_images([Image.open(io.BytesIO(data)).convert("RGB") for data in images or []])
    with torch.inference_mode():
        embeddings = model(**inputs).embeddings
    return [row[mask.bool()] for row, mask in zip(embeddings, inputs["attention_mask"], strict=True)]


def image_item(data: bytes) -> types_pb2.Item:
    return types_pb2.Item(images=[types_pb2.Image(data=data)])


def encode(stub, model_id: str, items: list[types_pb2.Item], outputs: list[str]) -> Any:
    request = inference_pb2.EncodeRequest(model=model_id, items=items, output_types=outputs)
    return call_until_loaded(lambda: stub.Encode(request, timeout=120))[0].results


def assert_same_vectors(served: list[np.ndarray], expected: list[torch.Tensor]) -> None:
    for vectors, want in zip(served, expected, strict=True):
        assert vectors.shape == tuple(want.shape)
        cosines = (vectors * want.numpy()).sum(-1) / (np.linalg.norm(vectors, axis=-1) * np.linalg.norm(want.numpy(), axis=-1))
        assert cosines.min() >= 0.9999


@pytest.mark.parametrize("model_id", [COLPALI, COLQWEN2])
def test_queries_and_pages_embed_as_the_reference(colpali_stub, directories, model_id) -> None:
    items = [types_pb2.Item(text=QUERIES[0]), image_item(PAGES[0]), types_pb2.Item(text=QUERIES[1]), image_item(PAGES[1]), image_item(PAGES[2])]
    results = encode(colpali_stub, model_id, items, ["multivector"])
    served = [np.array(from_tensor(result.multivector)) for result in results]
    assert all(vectors.shape[1] == EMBEDDING_DIM for vectors in served)
    texts = reference(model_id, directories[model_id], texts=QUERIES[:2])
    pages = reference(model_id, directories[model_id], images=PAGES)
    assert_same_vectors(served, [texts[0], pages[0], texts[1], pages[1], pages[2]])
    # An image costs its tokens in a batch, as a text does: the answer counts them.
    response = colpali_stub.Encode(inference_pb2.EncodeRequest(model=model_id, items=items), timeout=60)
    assert response.tokens == sum(map(len, served))
    rows = [len(vectors) for vectors in served[1:2] + served[3:]]
    # ColPali gives every page one size; ColQwen2 as many vectors as a page's size has patches.
    assert (len(set(rows)) == 1) == (model_id == COLPALI)


@pytest.mark.parametrize("model_id", [COLPALI, COLQWEN2])
def test_maxsim_of_a_query_over_pages_equals_score_retrieval(colpali_stub, directories, model_id) -> None:
    processor, _ = loaded(model_id, directories[model_id])
    query = reference(model_id, directories[model_id], texts=QUERIES[:1])
    expected = processor.score_retrieval(query, reference(model_id, directories[model_id], images=PAGES))[0].numpy()
    response = call_until_loaded(
        lambda: colpali_stub.Score(
            inference_pb2.ScoreRequest(model=model_id, query=types_pb2.Item(text=QUERIES[0]), items=[image_item(page) for page in PAGES]),
            timeout=120,
        )
    )[0]
    scores = {entry.index: entry.score for entry in response.scores}
    np.testing.assert_allclose([scores[index] for index in range(len(PAGES))], expected, atol=1e-4)
    assert [entry.index for entry in response.scores] == list(np.argsort(-expected))


@pytest.mark.parametrize("model_id", [COLPALI, COLQWEN2])
def test_muvera_dense_of_a_page_and_a_query(colpali_stub, model_id) -> None:
    """MUVERA encodes every item of a request as a document, or as a query where the request says is_query."""
    items = [image_item(PAGES[1]), types_pb2.Item(text=QUERIES[0])]
    for is_query in (False, True):
        request = inference_pb2.EncodeRequest(model=model_id, items=items, output_types=["dense", "multivector"], is_query=is_query)
        for result in call_until_loaded(functools.partial(colpali_stub.Encode, request, timeout=120))[0].results:
            dense = np.array(from_tensor(result.dense))
            assert dense.shape == (MUVERA_DIMS,)
            expected = muvera(np.array(from_tensor(result.multivector)), MuveraParams.from_options(MUVERA), is_query=is_query)
            np.testing.assert_allclose(dense, expected, atol=1e-5)


@pytest.mark.parametrize("model_id", [COLPALI, COLQWEN2])
def test_concurrent_requests_get_their_own_vectors(colpali_stub, model_id) -> None:
    """Texts and images of concurrent requests are prepared on several threads at once and batched together."""
    items = [[types_pb2.Item(text=QUERIES[index % 3]), image_item(PAGES[index % 3])] for index in range(8)]
    alone = [encode(colpali_stub, model_id, request, ["multivector"]) for request in items[:3]]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda request: encode(colpali_stub, model_id, request, ["multivector"]), items))
    for index, answer in enumerate(answers):
        for result, expected in zip(answer, alone[index % 3], strict=True):
            np.testing.assert_allclose(from_tensor(result.multivector), from_tensor(expected.multivector), atol=1e-5)


def test_image_multivectors_are_bounded_before_the_forward_pass(colpali_stub) -> None:
    encode(colpali_stub, COLQWEN2, [image_item(PAGES[0])], ["multivector"])
    before = forward_passes(colpali_stub, COLQWEN2)
    for outputs in (["multivector"], ["dense"]):
        with pytest.raises(grpc.RpcError) as raised:
            colpali_stub.Encode(inference_pb2.EncodeRequest(model=COLQWEN2, items=[image_item(PAGES[1])] * 40, output_types=outputs), timeout=60)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(raised.value).reason == "MULTIVECTORS_TOO_LARGE"
    assert forward_passes(colpali_stub, COLQWEN2) == before
    with pytest.raises(grpc.RpcError) as raised:
        colpali_stub.Score(inference_pb2.ScoreRequest(model=COLQWEN2, query=types_pb2.Item(text="q"), items=[image_item(PAGES[1])] * 40), timeout=60)
    assert error_info(raised.value).reason == "SCORE_TOO_LARGE"
    # The query is encoded alongside the pages (and may have run); the pages never are.
    assert forward_passes(colpali_stub, COLQWEN2) <= before + 1


def test_an_image_of_extreme_aspect_ratio_is_refused_on_its_header(colpali_stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        encode(colpali_stub, COLQWEN2, [image_item(png(picture(4, (600, 2))))], ["multivector"])
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "IMAGE_ASPECT_RATIO_TOO_LARGE"


@pytest.mark.parametrize("model_id", [COLPALI, COLQWEN2])
def test_resized_pixels_and_rows_are_the_processors(directories, tmp_path, model_id) -> None:
    """The size an image is bounded at is the one its processor makes (ColQwen2: its patch grid, within min_pixels
    and max_pixels, for small, odd and large images), and an image's rows, known before the forward pass, are its
    tokens."""
    config_file = tmp_path / "model.yaml"
    config_file.write_text(f"id: {model_id}\npath: {directories[model_id]}\n{BODY}")
    config = load_model_config(config_file)
    context = LoadContext(config, config.profile(), directories[model_id], torch.device("cpu"), torch.float32, "sdpa", False, False)
    adapter = PageRetriever(context)
    processor, _ = loaded(model_id, directories[model_id])
    for size in [(56, 56), (60, 100), (30, 80), (5, 5), (1000, 700), (3000, 90)]:
        image = picture(5, size)
        inputs = processor.process_images([image])
        if model_id == COLQWEN2:
            _, rows, columns = inputs["image_grid_thw"][0].tolist()
            made = rows * columns * 14 * 14
        else:
            made = inputs["pixel_values"].shape[-1] * inputs["pixel_values"].shape[-2]
        assert adapter.resized_pixels(*size) == made
        (prepared,) = adapter.prepare([Input(image=image)], Query("encode", "image", ("multivector",)))
        assert prepared.rows == prepared.cost == inputs["input_ids"].shape[1]

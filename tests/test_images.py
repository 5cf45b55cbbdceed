"""Images through a CLIP-style dual encoder: embeddings equal CLIPModel's own, mixed requests keep their order,
concurrent image requests share batches, text-image scoring, and each bad image gets its precise refusal."""

from __future__ import annotations

import io
import struct
import threading
import zlib
from collections.abc import Callable

import grpc
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel, SiglipModel

from grpc_helpers import call_until_loaded, error_info, forward_passes, stacked
from sie.v1 import inference_pb2, types_pb2

CLIP = "test/tiny-clip"
TEXTS = ["a photo of a cat", "two dogs playing in the snow on a sunny day"]


def picture(seed: int, size: tuple[int, int]) -> Image.Image:
    """A random RGB picture of `size` (width, height): smooth gradients plus noise, so JPEG keeps it recognisable."""
    rng = np.random.default_rng(seed)
    width, height = size
    ramp = np.linspace(0, 255, width)[None, :, None] * rng.random(3) + np.linspace(0, 255, height)[:, None, None] * rng.random(3)
    pixels = np.clip(ramp / 2 + rng.integers(0, 60, (height, width, 3)), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def encoded(image: Image.Image, format: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=format)
    return buffer.getvalue()


def image_item(data: bytes, id: str = "", format: str = "") -> types_pb2.Item:
    return types_pb2.Item(id=id, images=[types_pb2.Image(data=data, format=format)])


class Reference:
    """CLIPModel run directly on the model directory: get_text_features / get_image_features."""

    def __init__(self, directory) -> None:
        self.model = CLIPModel.from_pretrained(directory).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        self.processor = AutoImageProcessor.from_pretrained(directory, backend="pil")

    def texts(self, texts: list[str]) -> np.ndarray:
        with torch.inference_mode():
            inputs = self.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
            return self.model.get_text_features(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).pooler_output.numpy()

    def images(self, encoded_images: list[bytes]) -> np.ndarray:
        decoded = [Image.open(io.BytesIO(data)) for data in encoded_images]
        with torch.inference_mode():
            pixels = self.processor(images=decoded, return_tensors="pt")["pixel_values"]
            return self.model.get_image_features(pixel_values=pixels).pooler_output.numpy()


@pytest.fixture(scope="module")
def reference(tiny_models) -> Reference:
    return Reference(tiny_models[CLIP])


JPEG = encoded(picture(1, (48, 40)), "JPEG")
PNG = encoded(picture(2, (37, 64)), "PNG")
WEBP = encoded(picture(3, (50, 50)), "WEBP")


def normalized(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def test_mixed_request_returns_text_and_image_embeddings_in_order_equal_to_clip(stub, reference) -> None:
    items = [
        types_pb2.Item(id="t0", text=TEXTS[0]),
        image_item(JPEG, "jpeg", "jpeg"),
        image_item(PNG, "png"),
        types_pb2.Item(id="t1", text=TEXTS[1]),
        image_item(WEBP, "webp", "image/webp"),
        # A supported hint that disagrees with the bytes: the bytes decide.
        image_item(JPEG, "jpeg-hinted-png", "png"),
    ]
    request = inference_pb2.EncodeRequest(model=CLIP, items=items, profile="raw")
    response, _ = call_until_loaded(lambda: stub.Encode(request, timeout=60))
    assert [result.id for result in response.results] == ["t0", "jpeg", "png", "t1", "webp", "jpeg-hinted-png"]
    served = stacked(result.dense for result in response.results)
    texts = reference.texts(TEXTS)
    images = reference.images([JPEG, PNG, WEBP])
    expected = np.stack([texts[0], images[0], images[1], texts[1], images[2], images[0]])
    np.testing.assert_allclose(served, expected, atol=1e-5)


def test_default_profile_normalizes_and_postprocesses_like_other_encoders(stub, reference) -> None:
    request = inference_pb2.EncodeRequest(model=CLIP, items=[image_item(PNG), types_pb2.Item(text=TEXTS[0])])
    served = stacked(result.dense for result in stub.Encode(request, timeout=60).results)
    expected = normalized(np.stack([reference.images([PNG])[0], reference.texts(TEXTS[:1])[0]]))
    np.testing.assert_allclose(served, expected, atol=1e-5)

    request.dims = 8
    request.output_dtype = "float16"
    results = stub.Encode(request, timeout=60).results
    assert results[0].dense.dtype == "float16" and list(results[0].dense.shape) == [8]
    np.testing.assert_allclose(stacked(result.dense for result in results), normalized(expected[:, :8]), atol=2e-3)

    model = stub.GetModel(inference_pb2.GetModelRequest(model=CLIP)).model
    assert list(model.inputs) == ["text", "image"] and list(model.tasks) == ["encode", "score"]


def test_score_text_query_over_images_and_image_query_over_texts(stub, reference) -> None:
    images = normalized(reference.images([JPEG, PNG, WEBP]))
    texts = normalized(reference.texts(TEXTS))

    response = stub.Score(
        inference_pb2.ScoreRequest(
            model=CLIP, query=types_pb2.Item(text=TEXTS[1]), items=[image_item(data, str(i)) for i, data in enumerate([JPEG, PNG, WEBP])]
        ),
        timeout=60,
    )
    expected = images @ texts[1]
    assert [entry.index for entry in response.scores] == list(np.argsort(-expected))
    for entry in response.scores:
        assert entry.item_id == str(entry.index)
        assert entry.score == pytest.approx(expected[entry.index], abs=1e-5)

    response = stub.Score(
        inference_pb2.ScoreRequest(model=CLIP, query=image_item(PNG), items=[types_pb2.Item(text=text) for text in TEXTS], top_k=1),
        timeout=60,
    )
    expected = texts @ images[1]
    assert len(response.scores) == 1 and response.scores[0].index == int(np.argmax(expected))
    assert response.scores[0].score == pytest.approx(expected.max(), abs=1e-5)


def test_siglip_reads_max_length_padded_text_and_its_own_image_processing(stub, tiny_models) -> None:
    """SigLIP reads the last text position, so the text is padded to the maximum length without a mask, as it was trained."""
    directory = tiny_models["test/tiny-siglip"]
    model = SiglipModel.from_pretrained(directory).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    processor = AutoImageProcessor.from_pretrained(directory, backend="pil")
    with torch.inference_mode():
        ids = tokenizer(TEXTS, padding="max_length", truncation=True, return_tensors="pt")["input_ids"]
        texts = model.get_text_features(input_ids=ids).pooler_output.numpy()
        pixels = processor(images=[Image.open(io.BytesIO(JPEG))], return_tensors="pt")["pixel_values"]
        image = model.get_image_features(pixel_values=pixels).pooler_output.numpy()[0]

    request = inference_pb2.EncodeRequest(
        model="test/tiny-siglip", items=[types_pb2.Item(text=TEXTS[0]), image_item(JPEG), types_pb2.Item(text=TEXTS[1])]
    )
    response, _ = call_until_loaded(lambda: stub.Encode(request, timeout=60))
    served = stacked(result.dense for result in response.results)
    np.testing.assert_allclose(served, normalized(np.stack([texts[0], image, texts[1]])), atol=1e-5)


def test_concurrent_image_requests_share_batches(batching_stub, reference) -> None:
    """The batching worker waits 300 ms for batches to fill: requests sent together meet there."""
    clients = 6
    pictures = {client: [encoded(picture(10 * client + i, (40 + client, 36)), "PNG") for i in range(2)] for client in range(clients)}

    def encode(client: int) -> np.ndarray:
        request = inference_pb2.EncodeRequest(model=CLIP, items=[image_item(data) for data in pictures[client]], profile="raw")
        return stacked(result.dense for result in batching_stub.Encode(request, timeout=60).results)

    call_until_loaded(lambda: encode(0))
    before = forward_passes(batching_stub, CLIP)
    results: dict[int, np.ndarray] = {}
    barrier = threading.Barrier(clients)

    def run(client: int) -> None:
        barrier.wait()
        results[client] = encode(client)

    threads = [threading.Thread(target=run, args=(client,)) for client in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    passes = forward_passes(batching_stub, CLIP) - before
    assert 1 <= passes < clients, f"{clients} concurrent image requests took {passes} forward passes"
    for client in range(clients):
        np.testing.assert_allclose(results[client], reference.images(pictures[client]), atol=1e-5)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height but whose pixel data is a few bytes: a decompression bomb's shape."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def encode_call(stub, *items: types_pb2.Item, model: str = CLIP) -> Callable[[], object]:
    return lambda: stub.Encode(inference_pb2.EncodeRequest(model=model, items=[types_pb2.Item(id="ok", text="fine"), *items]), timeout=60)


BAD_IMAGES = [
    ("undecodable bytes", image_item(b"definitely not an image", "junk"), "INVALID_IMAGE", "items[1] (id 'junk'): images[0]: not a JPEG, PNG or WebP image"),
    ("truncated jpeg", image_item(JPEG[:-200], "cut"), "INVALID_IMAGE", "the JPEG data cannot be decoded"),
    ("gif", image_item(encoded(picture(4, (8, 8)), "GIF"), "anim"), "UNSUPPORTED_IMAGE_FORMAT", "GIF images are not supported; send JPEG, PNG or WebP"),
    ("bmp", image_item(encoded(picture(4, (8, 8)), "BMP")), "UNSUPPORTED_IMAGE_FORMAT", "BMP images are not supported"),
    ("unsupported format hint", image_item(PNG, "hinted", "tiff"), "UNSUPPORTED_IMAGE_FORMAT", "format 'tiff' is not supported"),
    ("above SIE_MAX_IMAGE_PIXELS", image_item(png_header_only(8000, 6000), "big"), "IMAGE_TOO_LARGE", "(8000x6000 is 48000000 pixels); the limit is 40000000"),
    ("decompression bomb", image_item(png_header_only(100_000, 100_000), "bomb"), "IMAGE_TOO_LARGE", "more than 178956970 pixels); the limit is 40000000 pixels"),
    ("two images in one item", types_pb2.Item(id="two", images=[types_pb2.Image(data=PNG), types_pb2.Image(data=JPEG)]), "TOO_MANY_ITEM_INPUTS", "embeds one text or one image per item; this item has 2 images"),
    ("text and image in one item", types_pb2.Item(id="both", text="a cat", images=[types_pb2.Image(data=PNG)]), "TOO_MANY_ITEM_INPUTS", "this item has text and 1 image"),
]


@pytest.mark.parametrize("item, reason, message", [case[1:] for case in BAD_IMAGES], ids=[case[0] for case in BAD_IMAGES])
def test_bad_image_is_invalid_argument_naming_the_item_and_the_worker_keeps_serving(stub, item, reason, message) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        encode_call(stub, item)()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == reason
    assert error_info(caught.value).metadata["item"] == "1"
    assert message in caught.value.details()
    assert len(encode_call(stub, image_item(PNG))().results) == 2


def test_images_to_a_text_model_name_its_inputs(stub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        encode_call(stub, image_item(PNG, "pic"), model="test/tiny-mean")()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "INPUT_NOT_SUPPORTED"
    assert dict(error_info(caught.value).metadata) == {"item": "1", "item_id": "pic", "input": "image", "model": "test/tiny-mean"}
    assert "items[1] (id 'pic'): model test/tiny-mean does not take image input; its inputs: text" in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        stub.Score(
            inference_pb2.ScoreRequest(model="test/tiny-reranker", query=image_item(PNG), items=[types_pb2.Item(text="x")]), timeout=60
        )
    assert error_info(caught.value).reason == "INPUT_NOT_SUPPORTED" and "query: model test/tiny-reranker" in caught.value.details()


def test_client_sends_paths_pil_images_and_arrays_as_encoded_bytes(worker, tmp_path, reference) -> None:
    from sie_client import Item, SIEClient
    from sie_client.messages import item_message

    pil = Image.open(io.BytesIO(PNG))
    pil.load()
    path = tmp_path / "picture.png"
    path.write_bytes(PNG)
    jpeg_path = tmp_path / "picture.jpg"
    jpeg_path.write_bytes(JPEG)
    inputs = {"bytes": PNG, "path": path, "str path": str(path), "PIL": pil, "numpy": np.asarray(pil)}

    sent = item_message(Item(images=[np.asarray(pil), jpeg_path])).images
    assert sent[0].data.startswith(b"\x89PNG") and sent[0].format == "png"
    assert sent[1].data == JPEG and sent[1].format == "jpeg"
    with pytest.raises(TypeError, match="must be uint8"):
        item_message(Item(images=[np.asarray(pil) / 255.0]))

    with SIEClient(worker.address) as client:
        items = [Item(id=name, images=[image]) for name, image in inputs.items()] + [Item(id="jpeg", images=[jpeg_path])]
        results = client.encode(CLIP, items, profile="raw")
    assert [result["id"] for result in results] == [*inputs, "jpeg"]
    for result in results[:-1]:
        np.testing.assert_allclose(result["dense"], reference.images([PNG])[0], atol=1e-5)
    np.testing.assert_allclose(results[-1]["dense"], reference.images([JPEG])[0], atol=1e-5)

"""Open-vocabulary detection (GroundingDINO, OWLv2) through a real worker against the model, its processor and
transformers' own post-processing run in-process, on tiny random replicas built offline: the same labels, boxes in
pixels of the original image within 1e-3 relative, scores within 1e-4, best first. Also: the bounds of the labels
(a GroundingDINO prompt the model would cut, an OWLv2 label past its positions), of the options, and of the image
(checked on its header against the size the processor makes of it), and a text item to a detector."""

from __future__ import annotations

import functools
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from google.protobuf import struct_pb2
from PIL import Image
from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

from grpc_helpers import call_until_loaded, error_info, forward_passes
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_detectors import GROUNDING_DINO_MAX_TEXT_LEN, OWLV2_TEXT_LENGTH, build_tiny_grounding_dino, build_tiny_owlv2
from tiny_models import write_config
from worker_process import Services, WorkerProcess

GROUNDING_DINO = "test/tiny-grounding-dino"
OWLV2 = "test/tiny-owlv2"
BUILDERS = {GROUNDING_DINO: build_tiny_grounding_dino, OWLV2: build_tiny_owlv2}
DETECT = "inputs: [image]\ntasks: [extract]\nprofiles:\n  default:\n    adapter: zero_shot_detector\n"
# A profile whose run_options set the thresholds of requests that set none.
STRICT = "  strict:\n    extends: default\n    run_options: {threshold: 0.8, text_threshold: 0.75}\n"
LABELS = ["a cat", "Remote control", "dog"]
MAX_PIXELS = 200_000
Found = tuple[str, float, list[float]]  # an object's label, score and box


def picture(seed: int, size: tuple[int, int], mode: str = "RGB") -> Image.Image:
    """A random picture of `size` (width, height): gradients plus noise."""
    rng = np.random.default_rng(seed)
    width, height = size
    ramp = np.linspace(0, 255, width)[None, :, None] * rng.random(3) + np.linspace(0, 255, height)[:, None, None] * rng.random(3)
    pixels = np.clip(ramp / 2 + rng.integers(0, 60, (height, width, 3)), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels).convert(mode)


def encoded(image: Image.Image, format: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=format)
    return buffer.getvalue()


# Two with the same aspect ratio (one processed size: one forward pass), a third of another, a grey JPEG.
IMAGES = [
    encoded(picture(1, (70, 50)), "PNG"),
    encoded(picture(2, (140, 100)), "PNG"),
    encoded(picture(3, (40, 90)), "JPEG"),
    encoded(picture(4, (64, 64), "L"), "JPEG"),
]


@pytest.fixture(scope="module")
def directories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("detectors")
    return {model_id: build(root / model_id.split("/")[1]) for model_id, build in BUILDERS.items()}


@pytest.fixture(scope="module")
def detector_worker(services: Services, directories: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> WorkerProcess:
    configs = tmp_path_factory.mktemp("detection-configs")
    for model_id, directory in directories.items():
        write_config(configs, model_id, f"path: {directory}\n{DETECT}{STRICT if model_id == GROUNDING_DINO else ''}")
    return services.worker(
        {
            "SIE_MODELS_DIR": str(configs),
            "SIE_PRELOAD_MODELS": "",
            "SIE_MAX_IMAGE_PIXELS": str(MAX_PIXELS),
            # Batches wait 200 ms to fill, so that concurrent requests meet.
            "SIE_ADAPTIVE_BATCHING": "false",
            "SIE_MAX_BATCH_WAIT_MS": "200",
        },
        name="detection-worker",
    )


@pytest.fixture(scope="module")
def detector_stub(detector_worker: WorkerProcess) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with grpc.insecure_channel(detector_worker.address) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


@functools.cache
def loaded(directory: Path) -> tuple[Any, Any]:
    return AutoProcessor.from_pretrained(directory, backend="pil"), AutoModelForZeroShotObjectDetection.from_pretrained(directory).eval()


def reference(directory: Path, data: bytes, labels: list[str], threshold: float | None, text_threshold: float | None) -> list[Found]:
    """(label, score, box) of transformers' own processor, model and post-processing on one image, best first."""
    processor, model = loaded(directory)
    image = Image.open(io.BytesIO(data)).convert("RGB")
    grounding = model.config.model_type == "grounding-dino"
    inputs = processor(images=[image], text=labels if grounding else [labels], return_tensors="pt")
    with torch.inference_mode():
        output = model(**inputs)
    size = [(image.height, image.width)]
    if grounding:
        result = processor.post_process_grounded_object_detection(
            output, inputs["input_ids"], threshold=0.25 if threshold is None else threshold,
            text_threshold=0.25 if text_threshold is None else text_threshold, target_sizes=size,
        )[0]
    else:
        result = processor.post_process_grounded_object_detection(
            output, threshold=0.1 if threshold is None else threshold, target_sizes=size, text_labels=[labels]
        )[0]
    found = list(zip(result["text_labels"], result["scores"].tolist(), result["boxes"].tolist(), strict=True))
    return sorted(found, key=lambda entry: entry[1], reverse=True)


def image_item(data: bytes, id: str = "") -> types_pb2.Item:
    return types_pb2.Item(id=id, images=[types_pb2.Image(data=data)])


def extract(stub, model_id: str, items: list[types_pb2.Item], labels: list[str] = LABELS, threshold: float | None = None, **options: Any) -> inference_pb2.ExtractResponse:
    request = inference_pb2.ExtractRequest(model=model_id, items=items, labels=labels)
    if threshold is not None:
        request.threshold = threshold
    if options:
        request.options.CopyFrom(struct_pb2.Struct())
        request.options.update(options)
    response, _ = call_until_loaded(lambda: stub.Extract(request, timeout=60))
    return response


def served_objects(objects) -> list[Found]:
    return [(found.label, found.score, [found.box.x_min, found.box.y_min, found.box.x_max, found.box.y_max]) for found in objects]


def assert_same_objects(served: list[Found], expected: list[Found]) -> None:
    """The same objects, best first: each served one matches an expected one of its label, score (1e-4) and box
    (1e-3 relative). Matched without regard to order, since near-equal scores may swap between a batch and one
    image."""
    scores = [score for _, score, _ in served]
    assert scores == sorted(scores, reverse=True)
    assert len(served) == len(expected)
    unmatched = list(expected)
    for label, score, box in served:
        match = next(
            (
                entry
                for entry in unmatched
                if entry[0] == label and abs(entry[1] - score) <= 1e-4 and np.allclose(box, entry[2], rtol=1e-3, atol=1e-3)
            ),
            None,
        )
        assert match is not None, f"{(label, score, box)} is not among the expected {unmatched}"
        unmatched.remove(match)


CASES = [
    (GROUNDING_DINO, None, {}),
    (GROUNDING_DINO, 0.8, {"text_threshold": 0.75}),
    (OWLV2, None, {}),
    (OWLV2, 0.65, {}),
]


@pytest.mark.parametrize("model_id, threshold, options", CASES, ids=["gdino-defaults", "gdino-thresholds", "owlv2-default", "owlv2-threshold"])
def test_objects_equal_transformers_post_processing(detector_stub, directories, model_id, threshold, options) -> None:
    response = extract(detector_stub, model_id, [image_item(data, str(index)) for index, data in enumerate(IMAGES)], threshold=threshold, **options)
    assert [result.id for result in response.results] == [str(index) for index in range(len(IMAGES))]
    total = 0
    for data, result in zip(IMAGES, response.results, strict=True):
        expected = reference(directories[model_id], data, LABELS, threshold, options.get("text_threshold"))
        assert_same_objects(served_objects(result.objects), expected)
        total += len(expected)
    assert total >= 8


def test_a_profile_sets_the_default_thresholds(detector_stub, directories) -> None:
    request = inference_pb2.ExtractRequest(model=GROUNDING_DINO, items=[image_item(IMAGES[0])], labels=LABELS, profile="strict")
    response, _ = call_until_loaded(lambda: detector_stub.Extract(request, timeout=60))
    expected = reference(directories[GROUNDING_DINO], IMAGES[0], LABELS, 0.8, 0.75)
    assert len(expected) < len(reference(directories[GROUNDING_DINO], IMAGES[0], LABELS, None, None))
    assert_same_objects(served_objects(response.results[0].objects), expected)


def test_max_objects_keeps_the_best(detector_stub, directories) -> None:
    response = extract(detector_stub, GROUNDING_DINO, [image_item(IMAGES[0])], max_objects=3)
    assert_same_objects(served_objects(response.results[0].objects), reference(directories[GROUNDING_DINO], IMAGES[0], LABELS, None, None)[:3])


def test_concurrent_requests_with_the_same_labels_share_forward_passes(detector_stub, directories) -> None:
    clients = 4
    call_until_loaded(lambda: extract(detector_stub, OWLV2, [image_item(IMAGES[0])]))
    before = forward_passes(detector_stub, OWLV2)
    barrier = threading.Barrier(clients)
    answers: dict[int, inference_pb2.ExtractResponse] = {}

    def run(client: int) -> None:
        barrier.wait()
        answers[client] = extract(detector_stub, OWLV2, [image_item(IMAGES[client])])

    threads = [threading.Thread(target=run, args=(client,)) for client in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    passes = forward_passes(detector_stub, OWLV2) - before
    assert 1 <= passes < clients, f"{clients} concurrent requests took {passes} forward passes"
    for client in range(clients):
        expected = reference(directories[OWLV2], IMAGES[client], LABELS, None, None)
        assert_same_objects(served_objects(answers[client].results[0].objects), expected)


def test_the_client_returns_objects_with_boxes(detector_worker, directories) -> None:
    from sie_client import Item, SIEClient

    with SIEClient(detector_worker.address) as client:
        results = client.extract(GROUNDING_DINO, [Item(images=[IMAGES[1]])], labels=LABELS)
    expected = reference(directories[GROUNDING_DINO], IMAGES[1], LABELS, None, None)
    corners = [[found["box"][key] for key in ("x_min", "y_min", "x_max", "y_max")] for found in results[0]["objects"]]
    assert_same_objects([(found["label"], found["score"], box) for found, box in zip(results[0]["objects"], corners, strict=True)], expected)
    for found, (x_min, y_min, x_max, y_max) in zip(results[0]["objects"], corners, strict=True):  # the reference's format
        assert found["bbox"] == [round(x_min), round(y_min), round(x_max) - round(x_min), round(y_max) - round(y_min)]


def refusal(stub, model_id: str, items: list[types_pb2.Item], labels: list[str] = LABELS, **options: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        extract(stub, model_id, items, labels, **options)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return raised.value


def test_a_prompt_the_model_would_cut_is_refused(detector_stub) -> None:
    # [CLS] + 3 tokens a label ("word nine." ) + [SEP]: the 8th label passes GroundingDINO's max_text_len of 24.
    labels = [f"word {index}" for index in range(8)]
    error = refusal(detector_stub, GROUNDING_DINO, [image_item(IMAGES[0])], labels)
    assert error_info(error).reason == "LABELS_TOO_LONG"
    assert f"labels: the prompt they make is 26 tokens; grounding-dino reads at most {GROUNDING_DINO_MAX_TEXT_LEN}" in error.details()
    assert extract(detector_stub, GROUNDING_DINO, [image_item(IMAGES[0])], labels[:7]).results[0].objects is not None


def test_an_owlv2_label_past_its_positions_is_refused(detector_stub) -> None:
    labels = ["dog", "a very long name of a thing to look for"]
    error = refusal(detector_stub, OWLV2, [image_item(IMAGES[0])], labels)
    assert error_info(error).reason == "LABELS_TOO_LONG"
    assert f"labels[1] is 12 tokens; owlv2 reads at most {OWLV2_TEXT_LENGTH}" in error.details()


@pytest.mark.parametrize(
    "model_id, labels, options, reason, message",
    [
        (GROUNDING_DINO, ["st. louis"], {}, "INVALID_LABEL", "labels[0]: 'st. louis': GroundingDINO reads the labels as one prompt of phrases, each ended by '.' or '?'"),
        (GROUNDING_DINO, LABELS, {"text_threshold": 1.5}, "INVALID_OPTIONS", "text_threshold: must be a number from 0 to 1, got 1.5"),
        (GROUNDING_DINO, LABELS, {"max_objects": 0}, "INVALID_OPTIONS", "max_objects: must be a whole number from 1 to 1000"),
        (OWLV2, LABELS, {"max_objects": 2.5}, "INVALID_OPTIONS", "max_objects: must be a whole number from 1 to 1000, got 2.5"),
        (OWLV2, LABELS, {"text_threshold": 0.3}, "UNKNOWN_OPTION", "owlv2 reads no option 'text_threshold'; it reads: max_objects"),
    ],
    ids=["dot-in-label", "text-threshold", "max-objects-zero", "max-objects-fraction", "owlv2-text-threshold"],
)
def test_bad_labels_and_options_are_refused(detector_stub, model_id, labels, options, reason, message) -> None:
    error = refusal(detector_stub, model_id, [image_item(IMAGES[0])], labels, **options)
    assert error_info(error).reason == reason
    assert message in error.details()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height and whose pixel data is a few bytes."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    "model_id, size, message",
    [
        (GROUNDING_DINO, (600, 400), "image too large (600x400 is 240000 pixels); the limit is 200000"),
        # Within the bound itself, but OWLv2 pads it to a 1000 x 1000 square before resizing.
        (OWLV2, (1000, 100), "the model's processor would resize the 1000x100 image to 1000000 pixels"),
    ],
)
def test_an_image_too_large_is_refused_before_decoding(detector_stub, model_id, size, message) -> None:
    error = refusal(detector_stub, model_id, [image_item(IMAGES[0], "fine"), image_item(png_header_only(*size), "big")])
    assert error_info(error).reason == "IMAGE_TOO_LARGE" and error_info(error).metadata["item"] == "1"
    assert message in error.details()


def test_resized_pixels_is_what_the_processor_makes(directories) -> None:
    from sie_worker.adapters.families.detector import processed_pixels

    for model_id, directory in directories.items():
        processor = AutoProcessor.from_pretrained(directory, backend="pil").image_processor
        family = "grounding-dino" if model_id == GROUNDING_DINO else "owlv2"
        for size in [(70, 50), (40, 90), (300, 20), (48, 48), (96, 200)]:
            pixels = processor(images=[picture(0, size)], return_tensors="np")["pixel_values"][0]
            made = pixels.shape[1] * pixels.shape[2]
            if family == "owlv2":
                made = max(made, max(size) ** 2)  # the square it pads the image to, before resizing
            assert processed_pixels(processor, family, *size) == made


def test_a_text_item_to_a_detector_is_input_not_supported(detector_stub) -> None:
    error = refusal(detector_stub, OWLV2, [image_item(IMAGES[0]), types_pb2.Item(id="words", text="a cat on a sofa")])
    assert error_info(error).reason == "INPUT_NOT_SUPPORTED"
    assert "items[1] (id 'words'): model test/tiny-owlv2 does not take text input; its inputs: image" in error.details()
